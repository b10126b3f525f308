// A C++ program built against the installed package: the public headers compile as C++ (every
// declaration inside extern "C"), and the calls link against the C library.
#include <meshtrain/meshtrain.h>

#include <cstdio>
#include <cstring>
#include <string>

int main() {
    int failures = 0;
    auto expect = [&](bool ok, const char *what) {
        if (!ok) {
            std::fprintf(stderr, "consumer++: expected %s (%s)\n", what, mt_last_error());
            failures++;
        }
    };
    expect(std::string(mt_version()).find('.') != std::string::npos, "a dotted version");
    mt_dtype dtype = MT_F32;
    expect(mt_dtype_parse("bf16", &dtype) == MT_OK && dtype == MT_BF16, "bf16 parses");
    expect(mt_dtype_parse("nonsense", &dtype) == MT_ERR_INVALID_ARG, "a bad dtype is refused");
    expect(std::strstr(mt_last_error(), "nonsense") != nullptr, "the error names the input");
    mt_device *dev = nullptr;
    expect(mt_device_open_cpu(1u << 20, &dev) == MT_OK, "a CPU device opens");
    void *p = nullptr;
    if (dev) {
        expect(mt_device_alloc(dev, 1024, MT_MEM_ACTIVATIONS, &p) == MT_OK, "an allocation");
        mt_device_free(dev, p);
        mt_device_close(dev);
    }
    std::printf("consumer++: meshtrain %s: %s\n", mt_version(), failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
