// cpkv: the command line of the CP shared-KV compose exchange testbed.
#include <algorithm>
#include <cstdio>
#include <string>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.hpp"
#include "files.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/harness/shared_region.hpp"
#include "cpkv/traces/trace.hpp"

namespace {

// An error line longer than this is cut (a trace line or a file name can be megabytes long; a
// terminal line must stay readable and a log line bounded).
constexpr std::size_t kErrorLineCharsMax = 480;  // room for the list of valid names an unknown one is told

// Every error the CLI reports goes through here: one line, the user's file names (not the spool's),
// at most kErrorLineCharsMax characters, never cutting a UTF-8 sequence in two.
void print_error(const std::string& what) {
  std::string text = cpkv::cli::with_input_names(what);
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
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

}  // namespace

int& cpkv::cli::exit_status() {
  static int status = cpkv::cli::kExitOk;
  return status;
}

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
  cpkv::cli::register_import(app);
#if CPKV_HAVE_CUDA_BACKEND
  cpkv::cli::register_bench(app);
#endif
  // SIGINT/SIGTERM/SIGHUP: end every rank, remove the shared memory, one line, exit 128 + signal.
  cpkv::harness::install_interrupt_handling();
  cpkv::harness::set_activity(argc > 1 ? fmt::format("cpkv {}", argv[1]) : "cpkv");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the option and the reason; CLI11's own text already does that.
    print_error(with_subcommands(app, e.what()));
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
  } catch (const std::exception& e) {
    // Anything else (no memory for the shared region, a failed fork, a full disk): one line, not a crash.
    print_error(e.what());
    return cpkv::cli::kExitFailure;
  }
  return cpkv::cli::exit_status();
}
