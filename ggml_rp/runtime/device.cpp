#include "ggml_rp/runtime/device.h"

namespace rp {

std::string stream_name(int stream) {
    switch (stream) {
    case static_cast<int>(StreamKind::WeightUpload): return "weight_upload";
    case static_cast<int>(StreamKind::ActivationUpload): return "activation_upload";
    case static_cast<int>(StreamKind::Compute): return "compute";
    case static_cast<int>(StreamKind::Download): return "download";
    default: return "stream" + std::to_string(stream);
    }
}

} // namespace rp
