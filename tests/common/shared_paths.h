// Where the tests find ../shared (models, references): the RP_SHARED_DIR environment variable, else the path
// CMake compiled in. Shared by every test program.
#pragma once

#include <cstdlib>
#include <string>

namespace rp_test {

inline std::string shared_dir() {
    const char * e = std::getenv("RP_SHARED_DIR");
    return e && *e ? e : RP_SHARED_DIR;
}
inline std::string models_dir() { return shared_dir() + "/models"; }

} // namespace rp_test
