// placeholder: registers nothing yet
#include "apps/strata/commands.h"
namespace strata::app {
void register_train(CLI::App&) {}
}  // namespace strata::app
