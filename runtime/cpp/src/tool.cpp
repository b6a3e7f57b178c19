#include "norcal/tool.hpp"

#include <exception>
#include <iostream>

namespace norcal {

int run_tool(int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace norcal
