// Fault injection for the tests of the reference checks (rp-check must catch a wrong backward): with
// RP_TEST_PERTURB_BACKWARD=rms_norm:0.01 in the environment, the gradient that rms_norm's backward rule gives
// its weight is scaled by 1.01 — a 1% error in one kernel's backward, on every device (the rule is shared).
// Compiled in only when RP_TEST_HOOKS is on: by default when the tests are built (BUILD_TESTING); a build
// without them (-DBUILD_TESTING=OFF) leaves the hook out and this is a constant 0.
#pragma once

namespace rp::test_hooks {

// The fraction by which the backward of `op` ("rms_norm") is perturbed; 0 when it is not. Read once.
float backward_perturbation(const char * op);

} // namespace rp::test_hooks
