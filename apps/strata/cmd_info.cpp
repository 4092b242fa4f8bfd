// placeholder: registers nothing yet
#include "apps/strata/commands.h"
namespace strata::app {
void register_info(CLI::App&) {}
}  // namespace strata::app
