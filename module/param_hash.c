/* The counter-based hash of seed-defined values (module/param_hash.h). The constants and the
 * order of the mixing are part of every model's initial values: changing them changes what a
 * seed means (train_gpt's losses, checkpoints compared across versions). */
#include "module/param_hash.h"

#include <math.h>

uint64_t mt_hash_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double mt_hash_open_unit(uint64_t seed, uint64_t stream, uint64_t index, uint64_t salt) {
    uint64_t h = mt_hash_mix64(index ^ mt_hash_mix64(salt));
    h = mt_hash_mix64(seed ^ mt_hash_mix64(stream ^ h));
    /* 53 random bits, offset by half a step: never 0 (Box-Muller takes its logarithm). */
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double mt_hash_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    double u1 = mt_hash_open_unit(seed, stream, index, 1);
    double u2 = mt_hash_open_unit(seed, stream, index, 2);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
