#include "ggml_rp/ops/test_hooks.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace rp::test_hooks {

float backward_perturbation(const char * op) {
#ifdef RP_TEST_HOOKS
    static const std::string spec = [] {
        const char * e = std::getenv("RP_TEST_PERTURB_BACKWARD");
        return std::string(e ? e : "");
    }();
    const size_t colon = spec.find(':');
    if (colon == std::string::npos || spec.compare(0, colon, op) != 0) return 0.0f;
    return std::strtof(spec.c_str() + colon + 1, nullptr);
#else
    (void)op;
    return 0.0f;
#endif
}

} // namespace rp::test_hooks
