/* A stand-in for libamdhip64.so on machines without ROCm, so that the tests can drive trident's
 * HIP table through a real dlopen: a runtime that reports HIP 6.2.41133 and two devices that look
 * like MI250X GCDs (gfx90a, 110 compute units, 64 GiB), and a hipModuleLoadData that refuses (it
 * cannot run kernels). hipGetDeviceProperties writes a struct of its own layout, not ROCm's: trident
 * must find gcnArchName by content, not by offset. Environment: FAKE_HIP_INIT_FAIL=1 makes hipInit
 * return hipErrorNoDevice. Built with -DFAKE_HIP_OLD, it lacks hipDeviceGetAttribute (a runtime
 * older than trident needs) and hipGetErrorName / hipGetErrorString, so trident names codes from
 * its own table. */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

typedef int hipError_t;

struct fake_device_prop {
    char name[256];
    size_t totalGlobalMem;
    int fields_before_the_arch[200];
    int gcnArch;
    char gcnArchName[256];
    int fields_after_the_arch[64];
};

hipError_t hipInit(unsigned flags) { (void)flags; return getenv("FAKE_HIP_INIT_FAIL") ? 100 : 0; }
hipError_t hipDriverGetVersion(int *v) { *v = 60241133; return 0; }
hipError_t hipRuntimeGetVersion(int *v) { *v = 60241133; return 0; }
hipError_t hipGetDeviceCount(int *n) { *n = 2; return 0; }
hipError_t hipDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal > 1) return 101; *d = ordinal; return 0; }
hipError_t hipDeviceGetName(char *name, int len, int d) { (void)d; strncpy(name, "AMD Instinct MI250X", (size_t)len); return 0; }
hipError_t hipDeviceTotalMem(size_t *bytes, int d) { (void)d; *bytes = (size_t)64 << 30; return 0; }
#ifndef FAKE_HIP_OLD
hipError_t hipDeviceGetAttribute(int *v, int attribute, int d) {
    (void)d;
    switch (attribute) {
    case 56: *v = 1024; return 0; /* max threads per block */
    case 63: *v = 110; return 0;  /* compute units */
    case 87: *v = 64; return 0;   /* wavefront size */
    default: return 1;            /* hipErrorInvalidValue */
    }
}
const char *hipGetErrorName(hipError_t code) {
    switch (code) {
    case 100: return "hipErrorNoDevice";
    case 801: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}
const char *hipGetErrorString(hipError_t code) {
    switch (code) {
    case 100: return "no ROCm-capable device is detected";
    case 801: return "fake HIP runtime: cannot run kernels";
    default: return "unknown error";
    }
}
#endif
hipError_t hipGetDeviceProperties(void *out, int d) {
    struct fake_device_prop p;
    if (d < 0 || d > 1) return 101;
    memset(&p, 0, sizeof p);
    strcpy(p.name, "AMD Instinct MI250X");
    p.totalGlobalMem = (size_t)64 << 30;
    p.fields_before_the_arch[7] = 110;
    p.gcnArch = 910;
    strcpy(p.gcnArchName, "gfx90a:sramecc+:xnack-");
    memcpy(out, &p, sizeof p);
    return 0;
}
hipError_t hipModuleLoadData(void **module, const void *image) { (void)module; (void)image; return 801; }
