// The CLI's side of the backend registry (harness/request.hpp): the registry of this build (sim,
// cuda where it was built, model), and the request's checks with a RequestError turned into the
// CLI's one-line bad-input error (exit 2), the option spelled as on the command line.
#pragma once

#include <memory>
#include <string>

#include "cpkv/harness/request.hpp"

namespace cpkv::cli {

const harness::Registry& backends();
// "sim (...), cuda (...) or model (...)": the --backend help text, from the registry.
std::string backends_help();

// The replay's run checked whole (harness check_run: the options, then the command's files through
// `source_file`, then the source against them; a handed-off run's source with it).
harness::CheckedRequest checked_request(const harness::ReplayRequest& request, const harness::SourceFile& source_file);
harness::CheckedBench checked_bench(const harness::BenchRequest& request);
// The request's bench through its backend's entry (check_bench_request made sure it has one).
harness::BenchReport benched(const harness::CheckedBench& bench, const harness::BatchSource& source, const harness::BenchPrint& print);
// The request's backend through its entry's replay verb (what needs the source checked first).
std::unique_ptr<harness::Backend> made_backend(const harness::CheckedRequest& request, const harness::BatchSource& source, const harness::ScannedSource& scanned,
                                               const harness::ProgressFunction& progress);

}  // namespace cpkv::cli
