/* A stand-in for libhiprtc.so on machines without ROCm: reports hipRTC 6.2 and describes one
 * code, so the tests can check trident's hipRTC table, version line and error mapping. It
 * compiles nothing. */
#include <stddef.h>

int hiprtcVersion(int *major, int *minor) { *major = 6; *minor = 2; return 0; }
const char *hiprtcGetErrorString(int code) { return code == 6 ? "HIPRTC_ERROR_COMPILATION" : NULL; }
