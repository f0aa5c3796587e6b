// In-memory datasets: shape helpers, Keras-style validation split, the synthetic source.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/data/pipeline.h"
#include "engine/data/random.h"

namespace td {

Shape Dataset::sampleShape() const {
    if (x.empty() || x.rank() == 0) return {};
    return Shape(x.shape().begin() + 1, x.shape().end());
}

std::pair<Dataset, Dataset> splitTail(const Dataset& d, double fraction) {
    // Keras: split_at = int(n * (1 - validation_split)); fractions outside [0, 1] are clamped
    // (validating the user's value is the project loader's job).
    fraction = std::clamp(fraction, 0.0, 1.0);
    const int64_t n = d.size();
    const auto splitAt = static_cast<int64_t>(static_cast<double>(n) * (1.0 - fraction));
    Dataset head = d, tail = d;
    if (n == 0) return {head, tail};
    head.x = d.x.slice(0, splitAt);
    head.y = d.y.slice(0, splitAt);
    tail.x = d.x.slice(splitAt, n);
    tail.y = d.y.slice(splitAt, n);
    return {head, tail};
}

Dataset makeSynthetic(int64_t samples, const Shape& sampleShape, int64_t classes, uint64_t seed) {
    TD_ASSERT(samples >= 0 && classes >= 1 && numElements(sampleShape) > 0);
    const int64_t dims = numElements(sampleShape);
    // Class centroids ~ N(0, 1) per dimension; a sample is its centroid plus N(0, 1) noise, so the
    // class means are about sqrt(2 * dims) noise standard deviations apart: a small MLP learns it.
    std::vector<float> centroids(static_cast<size_t>(classes * dims));
    Rng centroidRng(deriveSeed(seed, ~0ull));
    for (float& c : centroids) c = static_cast<float>(centroidRng.normal());

    Shape xShape{samples};
    xShape.insert(xShape.end(), sampleShape.begin(), sampleShape.end());
    Dataset d;
    d.x = Tensor(DType::F32, xShape);
    d.y = Tensor(DType::I32, {samples});
    d.numClasses = classes;
    float* x = d.x.data<float>();
    int32_t* y = d.y.data<int32_t>();
    for (int64_t i = 0; i < samples; ++i) {
        // One stream per sample: sample i does not depend on how many samples are drawn.
        Rng rng(deriveSeed(seed, static_cast<uint64_t>(i)));
        const auto label = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(classes)));
        y[i] = static_cast<int32_t>(label);
        const float* centroid = centroids.data() + label * dims;
        float* row = x + i * dims;
        for (int64_t k = 0; k < dims; ++k) row[k] = centroid[k] + static_cast<float>(rng.normal());
    }
    return d;
}

}  // namespace td
