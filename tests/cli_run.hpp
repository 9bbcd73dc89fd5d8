// Running the real cpkv binary from a test, the one way every CLI test does it: an argument vector
// (no shell unless the test asks for one), stdout and stderr captured through files, the exit
// status, and the check every bad input must pass (one line on stderr, exit 2, nothing on stdout).
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace cpkv::test {

namespace fs = std::filesystem;

struct CliRun {
  int status = -1;  // the exit status; -1 when the process did not exit (a signal)
  std::string out;
  std::string err;
};

struct RunSetup {
  fs::path cwd;                                   // default: the source tree (documented relative paths hold)
  std::vector<std::string> env;                   // NAME=value added to the environment
  std::optional<rlim_t> file_size_max_bytes;      // RLIMIT_FSIZE (a full disk, for writes)
  std::optional<rlim_t> address_space_max_bytes;  // RLIMIT_AS
};

inline std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A scratch folder of this test process (`stem` names the suite), and a file written into it.
inline fs::path temp_dir(const std::string& stem) {
  const fs::path dir = fs::temp_directory_path() / (stem + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}
inline std::string write_temp(const std::string& stem, const std::string& name, const std::string& text) {
  const fs::path path = temp_dir(stem) / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

inline fs::path cpkv_binary() { return fs::path(CPKV_BINARY_DIR) / "cli" / "cpkv"; }

inline std::string sample(const std::string& name) { return (fs::path(CPKV_SOURCE_DIR) / "traces" / "samples" / name).string(); }

// Runs argv (argv[0] a path) without a shell. stdout and stderr go to dir/stdout and dir/stderr;
// TMPDIR is dir/tmp (created here), so spool files left behind would be seen.
inline CliRun spawn(const std::vector<std::string>& argv, const fs::path& dir, const RunSetup& setup = {}) {
  const fs::path out = dir / "stdout", err = dir / "stderr";
  fs::create_directories(dir / "tmp");
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir((setup.cwd.empty() ? fs::path(CPKV_SOURCE_DIR) : setup.cwd).c_str()) != 0) ::_exit(126);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::setenv("TMPDIR", (dir / "tmp").c_str(), 1);
    for (const std::string& kv : setup.env) ::putenv(const_cast<char*>(kv.c_str()));
    if (setup.file_size_max_bytes) {
      std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG, like a full disk
      const rlimit limit{*setup.file_size_max_bytes, *setup.file_size_max_bytes};
      ::setrlimit(RLIMIT_FSIZE, &limit);
    }
    if (setup.address_space_max_bytes) {
      const rlimit limit{*setup.address_space_max_bytes, *setup.address_space_max_bytes};
      ::setrlimit(RLIMIT_AS, &limit);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int raw = 0;
  ::waitpid(pid, &raw, 0);
  CliRun run;
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = slurp(out);
  run.err = slurp(err);
  return run;
}

// Runs cpkv with `args`, the test's own text, shell-quoted where needed, from the source tree; the
// output files live in a folder of their own, removed afterwards.
inline CliRun run_cpkv(const std::string& args) {
  static std::atomic<int> runs{0};
  const fs::path dir = fs::temp_directory_path() / fmt::format("cpkv_cli_run_{}_{}", ::getpid(), runs++);
  const CliRun run = spawn({"/bin/sh", "-c", fmt::format("exec '{}' {}", cpkv_binary().string(), args)}, dir);
  fs::remove_all(dir);
  return run;
}

inline bool one_line(const std::string& text) { return !text.empty() && text.find('\n') == text.size() - 1; }

// Bad input: one line on stderr naming `what` (and where), exit status 2, nothing on stdout.
inline void expect_bad_input(const CliRun& run, const std::string& what) {
  EXPECT_EQ(run.status, 2) << run.err << run.out;
  EXPECT_TRUE(one_line(run.err)) << "stderr must be one line: " << run.err;
  EXPECT_NE(run.err.find(what), std::string::npos) << "names " << what << ": " << run.err;
  EXPECT_TRUE(run.out.empty()) << "no partial result: " << run.out;
}

}  // namespace cpkv::test
