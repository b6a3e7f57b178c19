// What the command-line tools share: one way to turn an exception into "error: ..." and exit 2.
#pragma once

namespace norcal {

// run(argc, argv)'s status; an exception it throws is printed as one line, and 2 returned.
int run_tool(int (*run)(int, char**), int argc, char** argv);

}  // namespace norcal
