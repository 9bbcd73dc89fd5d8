// cpkv: the command line of the CP shared-KV compose exchange testbed.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <system_error>
#include <string>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.hpp"
#include "files.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/harness/shared_region.hpp"
#include "cpkv/traces/text.hpp"
#include "cpkv/traces/trace.hpp"

namespace {

// An error line longer than this is cut (a trace line or a file name can be megabytes long; a
// terminal line must stay readable and a log line bounded).
constexpr std::size_t kErrorLineCharsMax = 480;  // room for the list of valid names an unknown one is told

// A file name or a quoted input may hold any byte: a control character or a byte that is not
// UTF-8 is written as \xNN, so the terminal neither acts on it nor shows a broken glyph (issue
// 22, item 23); newlines become spaces (one line).
std::string printable(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return cpkv::traces::escape_bytes(text, /*controls=*/true);
}

// Every error the CLI reports goes through here: one line, the user's file names (not the spool's),
// at most kErrorLineCharsMax characters, never cutting a UTF-8 sequence in two.
void print_error(const std::string& what) {
  std::string text = printable(cpkv::cli::with_input_names(what));
  if (text.size() > kErrorLineCharsMax) {
    std::size_t cut = kErrorLineCharsMax;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = fmt::format("{}... ({} characters cut)", text.substr(0, cut), text.size() - cut);
  }
  // fputs, not fmt::print: a failing stderr (a full disk) must not turn the error into an abort.
  std::fputs(fmt::format("cpkv: error: {}\n", text).c_str(), stderr);
}

// CLI11 says "A subcommand is required"; the user also needs to know which ones exist.
std::string with_subcommands(const CLI::App& app, const std::string& what) {
  if (what.rfind("A subcommand is required", 0) != 0) return what;
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  std::string names;
  for (const CLI::App* sub : at->get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return fmt::format("{}: one of {} (see cpkv {}--help)", what, names, at == &app ? "" : at->get_name() + " ");
}

// The first word of the command line that should name a subcommand and names none (`vllm` in
// `cpkv import vllm`), or null: each word is looked up among the subcommands of the one before.
const char* unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  for (int i = 1; i < argc; ++i) {
    const auto subcommands = at->get_subcommands([](const CLI::App*) { return true; });
    if (subcommands.empty() || argv[i][0] == '-') return nullptr;
    const auto sub = std::find_if(subcommands.begin(), subcommands.end(), [&](const CLI::App* s) { return s->get_name() == argv[i]; });
    if (sub == subcommands.end()) return argv[i];
    at = *sub;
  }
  return nullptr;
}

}  // namespace

int& cpkv::cli::exit_status() {
  static int status = cpkv::cli::kExitOk;
  return status;
}

namespace {

// Standard output carries the report: one that could not be written (a full disk, /dev/full, a
// closed pipe now that SIGPIPE is ignored, a closed stdout) is a failure naming it, never exit 0
// with the output lost (issue 22, item 4). Not fclose: RapidCheck writes at exit.
int with_output_checked(int status) {
  errno = 0;  // cout.flush() is stdout's fflush (synced): its errno is the reason
  std::cout.flush();
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && std::ferror(stdout) == 0 && std::cout.good()) return status;
  print_error(fmt::format("cannot write standard output: {}", error != 0 ? std::strerror(error) : "a write failed"));
  return status == cpkv::cli::kExitOk ? cpkv::cli::kExitFailure : status;
}

// What went wrong, for an exception no one else caught: a failed write to standard output says so
// (fmt's own text is "cannot write to file"), anything else is its own message.
std::string failure_text(const std::exception& e) {
  const auto* system = dynamic_cast<const std::system_error*>(&e);
  if (std::ferror(stdout) != 0 && system != nullptr) return fmt::format("cannot write standard output: {}", system->code().message());
  return e.what();
}

int run(CLI::App& app, int argc, char** argv) {
  try {
    // SIGINT, SIGTERM, SIGHUP and the rest (interrupt.hpp): end every rank, remove the shared
    // memory, one line, exit 128 + signal. Inside the try: with no descriptor or thread left it
    // is one line, not an abort.
    cpkv::harness::install_interrupt_handling();
    cpkv::harness::set_activity(argc > 1 ? fmt::format("cpkv {}", argv[1]) : "cpkv");
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the option and the reason; CLI11's own text already does that, but for a
    // first word that is no subcommand ("A subcommand is required" named not what was typed).
    // At any depth: `cpkv import vllm` named neither `vllm` nor that it is no importer (issue 34).
    const char* word = unknown_subcommand(app, argc, argv);
    print_error(with_subcommands(app, word != nullptr ? fmt::format("A subcommand is required; '{}' is none", word) : e.what()));
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::traces::TraceError& e) {
    print_error(e.what());
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::harness::SharedMemoryFull& e) {
    print_error(e.what());  // the run as asked does not fit this machine's /dev/shm
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::cli::OptionError& e) {
    print_error(e.what());
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::harness::RequestError& e) {
    // The request's refusal (its check, or a verb's before any work: no GPU, too few), the option
    // spelled as on the command line.
    print_error(e.cli_message());
    return cpkv::cli::kExitBadInput;
  } catch (const std::bad_alloc&) {
    print_error("out of memory (an allocation failed; see ulimit -v and the machine's free memory)");
    return cpkv::cli::kExitFailure;
  } catch (const std::exception& e) {
    // Anything else (no memory for the shared region, a failed fork, a full disk): one line, not a crash.
    print_error(failure_text(e));
    return cpkv::cli::kExitFailure;
  }
  return cpkv::cli::exit_status();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cpkv: simulation and correctness-model testbed for the context-parallel shared-KV compose exchange.\n"
      "Plans, simulates, checks and measures how every rank of a CP group assembles its dense KV buffers."};
  app.require_subcommand(1);
  cpkv::cli::register_plan(app);
  cpkv::cli::register_replay(app);
  cpkv::cli::register_mutants(app);
  cpkv::cli::register_explore(app);
  cpkv::cli::register_soak(app);
  cpkv::cli::register_merge(app);
  cpkv::cli::register_import(app);
  cpkv::cli::register_bench(app);
  return with_output_checked(run(app, argc, argv));
}
