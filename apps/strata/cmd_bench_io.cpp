// placeholder: registers nothing yet
#include "apps/strata/commands.h"
namespace strata::app {
void register_bench_io(CLI::App&) {}
}  // namespace strata::app
