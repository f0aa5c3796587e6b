#include "engine/core/run_config.h"

namespace td {

const char* precisionName(PrecisionPolicy p) {
    switch (p) {
        case PrecisionPolicy::Float32:
            return "float32";
        case PrecisionPolicy::MixedFloat16:
            return "mixed_float16";
        case PrecisionPolicy::MixedBfloat16:
            return "mixed_bfloat16";
    }
    return "?";
}

}  // namespace td
