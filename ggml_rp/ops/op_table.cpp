// The op table (op_table.h): the op list's rows (core/ops.def), with their backward rules and CUDA traits.
#include "ggml_rp/ops/op_table.h"

#include "base/error.h"
#include "ggml_rp/ops/ops.h"

#include <string>

namespace rp {

namespace rules {
void no_gradient(Backward &, Tensor *) {}
} // namespace rules

namespace {

// The CUDA traits the rows name.
constexpr uint8_t kAll = 0x3f;  // every source read packed
constexpr uint8_t kFirst = 0x01;  // only source 0 (the activation; the others are weights, ids or labels)
constexpr CudaTraits kStrided{true, 0, false, false};                // reads and writes any strides
constexpr CudaTraits kElementwise{true, kAll, true, false};          // packed operands and output
constexpr CudaTraits kRowsFirst{true, kFirst, true, false};          // rope: packed activation and output
constexpr CudaTraits kIndexed{true, 0, false, true};                 // get_rows: weight rows + ids
constexpr CudaTraits kIndexedFirst{true, kFirst, false, true};       // scatter-add and the LM head
constexpr CudaTraits kPackedIn{true, kAll, false, false};            // attention: packed operands
constexpr CudaTraits kFirstOnly{true, kFirst, false, false};         // a streamed LM head's range

using namespace rules;

constexpr OpDesc kOps[] = {
#define RP_OP(op, shape, backward, cuda) {Op::op, #op, shape, backward, cuda},
#include "ggml_rp/core/ops.def"
#undef RP_OP
};
static_assert(sizeof kOps / sizeof kOps[0] == static_cast<size_t>(Op::COUNT), "one op table row per op");

} // namespace

const OpDesc & op_desc(Op op) {
    const size_t i = static_cast<size_t>(op);
    if (i >= static_cast<size_t>(Op::COUNT)) throw Error("op table: no op with value " + std::to_string(i));
    return kOps[i];
}

} // namespace rp
