// The one error type of ggml-rp. Library code throws rp::Error on bad input (a broken file, a wrong shape,
// a bad option) with a message naming the file, key, tensor or flag at fault; it never aborts the process.
// assert() is reserved for programming errors.
#pragma once

#include <stdexcept>
#include <string>

namespace rp {

struct Error : std::runtime_error {
    explicit Error(const std::string & what) : std::runtime_error(what) {}
};

} // namespace rp
