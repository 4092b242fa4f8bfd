// tests/sanitizers/tbb_one_thread.cpp — linked into every test program of a ThreadSanitizer
// build: holds oneTBB to one thread (the thread that calls into it) for the whole process.
//
// Why: the system's libtbb is not instrumented, so TSan cannot see the synchronization by which
// oneTBB hands a task (a parallel_for range and its body) from the thread that spawned it to a
// worker, and reports every such hand-off as a race in TBB's inline headers. With one thread
// there are no TBB workers; strata's own threads (stream workers, the Swapper, the POSIX I/O
// pool, communication streams) all still run, each calling into oneTBB on its own.
// It does not suppress anything: a race between two of strata's threads is still reported.
#include <tbb/global_control.h>

namespace {

const tbb::global_control one_tbb_thread(tbb::global_control::max_allowed_parallelism, 1);

}  // namespace
