/* A stand-in for libhiprtc.so on machines without ROCm: reports hipRTC 6.2 and describes one
 * code, so the tests can check trident's hipRTC table, version line and error mapping. It also
 * "compiles": a program needs --offload-arch=gfx90a or gfx942, a source holding "#error" fails
 * with HIPRTC_ERROR_COMPILATION and a log, and the code is a 64-byte AMDGPU ELF header for the
 * architecture (code object v4) followed by the source text (so a kernel's name is in it): enough
 * for the fake HIP runtime to load. Built with -DFAKE_HIPRTC_VERSION_ONLY it has only the version
 * and the error string (a library lacking entry points). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

int hiprtcVersion(int *major, int *minor) { *major = 6; *minor = 2; return 0; }
const char *hiprtcGetErrorString(int code) { return code == 6 ? "HIPRTC_ERROR_COMPILATION" : NULL; }

#ifndef FAKE_HIPRTC_VERSION_ONLY
struct program {
    char *source, *log;
    unsigned char *code;
    size_t code_bytes;
};

int hiprtcCreateProgram(struct program **p, const char *source, const char *name, int n, const char **headers,
                        const char **names) {
    (void)name; (void)n; (void)headers; (void)names;
    *p = calloc(1, sizeof **p);
    (*p)->source = strdup(source);
    (*p)->log = strdup("");
    return 0;
}
int hiprtcCompileProgram(struct program *p, int n, const char **options) {
    unsigned mach = 0;
    for (int i = 0; i < n; ++i) {
        if (strcmp(options[i], "--offload-arch=gfx90a") == 0) mach = 0x3f;
        if (strcmp(options[i], "--offload-arch=gfx942") == 0) mach = 0x4c;
    }
    free(p->log);
    if (mach == 0) { p->log = strdup("fake hipRTC: no --offload-arch=gfx90a or gfx942"); return 3; }
    if (strstr(p->source, "#error")) { p->log = strdup("kernel.hip:1:2: error: planted\n1 error generated."); return 6; }
    p->log = strdup("");
    size_t text = strlen(p->source);
    p->code_bytes = 64 + text;
    p->code = calloc(1, p->code_bytes);
    memcpy(p->code, "\x7f" "ELF", 4);
    p->code[4] = 2; p->code[5] = 1; p->code[6] = 1; p->code[7] = 64; p->code[8] = 2;
    uint16_t machine = 0xe0;
    uint32_t flags = mach;
    memcpy(p->code + 0x12, &machine, 2);
    memcpy(p->code + 0x30, &flags, 4);
    memcpy(p->code + 64, p->source, text);
    return 0;
}
int hiprtcGetProgramLogSize(struct program *p, size_t *n) { *n = strlen(p->log) + 1; return 0; }
int hiprtcGetProgramLog(struct program *p, char *out) { strcpy(out, p->log); return 0; }
int hiprtcGetCodeSize(struct program *p, size_t *n) { *n = p->code_bytes; return 0; }
int hiprtcGetCode(struct program *p, char *out) { memcpy(out, p->code, p->code_bytes); return 0; }
int hiprtcDestroyProgram(struct program **p) {
    free((*p)->source); free((*p)->log); free((*p)->code); free(*p);
    *p = NULL;
    return 0;
}
#endif
