// The reference prompts of ../shared/models/MANIFEST.md as stories260K token ids (with BOS), so that tests comparing
// logits with llama.cpp's reference files do not depend on the tokenizer.
#pragma once

#include <cstdint>
#include <vector>

namespace rp_test {

// "Once upon a time, there was a little girl named Lily." — pieces [<s>] [ Once] [ upon] [ a] [ time] [,] [ there]
// [ was] [ a] [ little] [ g] [ir] [l] [ named] [ Lily] [.] (reference/*.oracle.txt).
inline const std::vector<int32_t> kPrompt1 = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};
inline const std::vector<int32_t> kPrompt2 = {267, 117, 115, 261, 258, 265, 101, 97, 116, 257, 114, 268};

} // namespace rp_test
