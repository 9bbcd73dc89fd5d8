// cpkv: the command line of the CP shared-KV compose exchange testbed.
#include <algorithm>
#include <cstdio>
#include <string>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.hpp"
#include "cpkv/harness/interrupt.hpp"
#include "cpkv/sim/shared_region.hpp"
#include "cpkv/traces/trace.hpp"

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
    fmt::print(stderr, "cpkv: error: {}\n", e.what());
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::traces::TraceError& e) {
    fmt::print(stderr, "cpkv: error: {}\n", e.what());
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::sim::SharedMemoryFull& e) {
    fmt::print(stderr, "cpkv: error: {}\n", e.what());  // the run as asked does not fit this machine's /dev/shm
    return cpkv::cli::kExitBadInput;
  } catch (const cpkv::cli::OptionError& e) {
    fmt::print(stderr, "cpkv: error: {}\n", e.what());
    return cpkv::cli::kExitBadInput;
  } catch (const std::exception& e) {
    // Anything else (no memory for the shared region, a failed fork): one line, not a crash.
    std::string text = e.what();
    std::replace(text.begin(), text.end(), '\n', ' ');
    fmt::print(stderr, "cpkv: error: {}\n", text);
    return cpkv::cli::kExitFailure;
  }
  return cpkv::cli::exit_status();
}
