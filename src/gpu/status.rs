//! Status codes of the GPU libraries and their mapping onto `Error::GpuCall`: `CUresult` (CUDA
//! driver), `nvrtcResult` (NVRTC), `ncclResult_t` (NCCL and RCCL), `hipError_t` (HIP runtime) and
//! `hiprtcResult` (hipRTC). The tables hold the names from `cuda.h`, `nvrtc.h` and `nccl.h` (CUDA
//! 13.5, NCCL 2.32), `hip_runtime_api.h` and `hiprtc.h` (ROCm 5 and 6 agree on these), so an error can be named even when
//! the library that would describe it (`cuGetErrorName`) is the one that is missing; the library's
//! own message is preferred when it can be had.

use crate::error::Error;

/// `CUresult` values and names, from `cuda.h` (CUDA 13.5).
pub const CU_RESULT_NAMES: &[(i32, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (5, "CUDA_ERROR_PROFILER_DISABLED"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"),
    (205, "CUDA_ERROR_MAP_FAILED"),
    (206, "CUDA_ERROR_UNMAP_FAILED"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED"),
    (208, "CUDA_ERROR_ALREADY_MAPPED"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED"),
    (211, "CUDA_ERROR_NOT_MAPPED"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"),
    (226, "CUDA_ERROR_CONTAINED"),
    (227, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (402, "CUDA_ERROR_LOSSY_QUERY"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"),
    (907, "CUDA_ERROR_CAPTURED_EVENT"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"),
    (909, "CUDA_ERROR_TIMEOUT"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
    (916, "CUDA_ERROR_KEY_ROTATION"),
    (917, "CUDA_ERROR_STREAM_DETACHED"),
    (918, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE"),
    (919, "CUDA_ERROR_FABRIC_NOT_READY"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// `nvrtcResult` names, indexed by value, from `nvrtc.h` (CUDA 13.5).
pub const NVRTC_RESULT_NAMES: &[&str] = &[
    "NVRTC_SUCCESS",
    "NVRTC_ERROR_OUT_OF_MEMORY",
    "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
    "NVRTC_ERROR_INVALID_INPUT",
    "NVRTC_ERROR_INVALID_PROGRAM",
    "NVRTC_ERROR_INVALID_OPTION",
    "NVRTC_ERROR_COMPILATION",
    "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
    "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
    "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
    "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
    "NVRTC_ERROR_INTERNAL_ERROR",
    "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
    "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
    "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
    "NVRTC_ERROR_PCH_CREATE",
    "NVRTC_ERROR_CANCELLED",
    "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
    "NVRTC_ERROR_BUSY",
];

/// `ncclResult_t` names and NCCL's own descriptions (`ncclGetErrorString`), indexed by value,
/// from `nccl.h` (NCCL 2.32; RCCL uses the same values).
pub const NCCL_RESULT_NAMES: &[(&str, &str)] = &[
    ("ncclSuccess", "no error"),
    ("ncclUnhandledCudaError", "unhandled cuda error"),
    ("ncclSystemError", "unhandled system error"),
    ("ncclInternalError", "internal error"),
    ("ncclInvalidArgument", "invalid argument"),
    ("ncclInvalidUsage", "invalid usage"),
    ("ncclRemoteError", "remote process exited or there was a network error"),
    ("ncclInProgress", "NCCL operation in progress"),
    ("ncclTimeout", "timeout"),
];

/// `hipError_t` values and names, from `hip_runtime_api.h` (ROCm 6; the values have not moved
/// since ROCm 4). Deprecated aliases (`hipErrorMemoryAllocation` = 2, ...) give way to the
/// current names.
pub const HIP_ERROR_NAMES: &[(i32, &str)] = &[
    (0, "hipSuccess"),
    (1, "hipErrorInvalidValue"),
    (2, "hipErrorOutOfMemory"),
    (3, "hipErrorNotInitialized"),
    (4, "hipErrorDeinitialized"),
    (5, "hipErrorProfilerDisabled"),
    (6, "hipErrorProfilerNotInitialized"),
    (7, "hipErrorProfilerAlreadyStarted"),
    (8, "hipErrorProfilerAlreadyStopped"),
    (9, "hipErrorInvalidConfiguration"),
    (12, "hipErrorInvalidPitchValue"),
    (13, "hipErrorInvalidSymbol"),
    (17, "hipErrorInvalidDevicePointer"),
    (21, "hipErrorInvalidMemcpyDirection"),
    (35, "hipErrorInsufficientDriver"),
    (52, "hipErrorMissingConfiguration"),
    (53, "hipErrorPriorLaunchFailure"),
    (98, "hipErrorInvalidDeviceFunction"),
    (100, "hipErrorNoDevice"),
    (101, "hipErrorInvalidDevice"),
    (200, "hipErrorInvalidImage"),
    (201, "hipErrorInvalidContext"),
    (202, "hipErrorContextAlreadyCurrent"),
    (205, "hipErrorMapFailed"),
    (206, "hipErrorUnmapFailed"),
    (207, "hipErrorArrayIsMapped"),
    (208, "hipErrorAlreadyMapped"),
    (209, "hipErrorNoBinaryForGpu"),
    (210, "hipErrorAlreadyAcquired"),
    (211, "hipErrorNotMapped"),
    (212, "hipErrorNotMappedAsArray"),
    (213, "hipErrorNotMappedAsPointer"),
    (214, "hipErrorECCNotCorrectable"),
    (215, "hipErrorUnsupportedLimit"),
    (216, "hipErrorContextAlreadyInUse"),
    (217, "hipErrorPeerAccessUnsupported"),
    (218, "hipErrorInvalidKernelFile"),
    (219, "hipErrorInvalidGraphicsContext"),
    (300, "hipErrorInvalidSource"),
    (301, "hipErrorFileNotFound"),
    (302, "hipErrorSharedObjectSymbolNotFound"),
    (303, "hipErrorSharedObjectInitFailed"),
    (304, "hipErrorOperatingSystem"),
    (400, "hipErrorInvalidHandle"),
    (401, "hipErrorIllegalState"),
    (500, "hipErrorNotFound"),
    (600, "hipErrorNotReady"),
    (700, "hipErrorIllegalAddress"),
    (701, "hipErrorLaunchOutOfResources"),
    (702, "hipErrorLaunchTimeOut"),
    (704, "hipErrorPeerAccessAlreadyEnabled"),
    (705, "hipErrorPeerAccessNotEnabled"),
    (708, "hipErrorSetOnActiveProcess"),
    (709, "hipErrorContextIsDestroyed"),
    (710, "hipErrorAssert"),
    (712, "hipErrorHostMemoryAlreadyRegistered"),
    (713, "hipErrorHostMemoryNotRegistered"),
    (719, "hipErrorLaunchFailure"),
    (720, "hipErrorCooperativeLaunchTooLarge"),
    (801, "hipErrorNotSupported"),
    (900, "hipErrorStreamCaptureUnsupported"),
    (901, "hipErrorStreamCaptureInvalidated"),
    (902, "hipErrorStreamCaptureMerge"),
    (903, "hipErrorStreamCaptureUnmatched"),
    (904, "hipErrorStreamCaptureUnjoined"),
    (905, "hipErrorStreamCaptureIsolation"),
    (906, "hipErrorStreamCaptureImplicit"),
    (907, "hipErrorCapturedEvent"),
    (908, "hipErrorStreamCaptureWrongThread"),
    (910, "hipErrorGraphExecUpdateFailure"),
    (911, "hipErrorInvalidChannelDescriptor"),
    (912, "hipErrorInvalidTexture"),
    (999, "hipErrorUnknown"),
    (1052, "hipErrorRuntimeMemory"),
    (1053, "hipErrorRuntimeOther"),
];

/// `hiprtcResult` values and names, from `hiprtc.h` (ROCm 5 and 6).
pub const HIPRTC_RESULT_NAMES: &[(i32, &str)] = &[
    (0, "HIPRTC_SUCCESS"),
    (1, "HIPRTC_ERROR_OUT_OF_MEMORY"),
    (2, "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE"),
    (3, "HIPRTC_ERROR_INVALID_INPUT"),
    (4, "HIPRTC_ERROR_INVALID_PROGRAM"),
    (5, "HIPRTC_ERROR_INVALID_OPTION"),
    (6, "HIPRTC_ERROR_COMPILATION"),
    (7, "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE"),
    (8, "HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION"),
    (9, "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION"),
    (10, "HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID"),
    (11, "HIPRTC_ERROR_INTERNAL_ERROR"),
    (100, "HIPRTC_ERROR_LINKING"),
];

/// The name of a `hipError_t`, or `hipError <code>` for a code this table does not know.
pub fn hip_error_name(code: i32) -> String {
    HIP_ERROR_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("hipError {code} (unknown to this build)"))
}

/// The name of a `hiprtcResult`.
pub fn hiprtc_result_name(code: i32) -> String {
    HIPRTC_RESULT_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("HIPRTC_ERROR_{code} (unknown to this build)"))
}

/// The error for a failed HIP runtime call. `described` is the runtime's own (name, message)
/// from hipGetErrorName / hipGetErrorString, when it could give them.
pub fn hip_error(call: &'static str, code: i32, described: Option<(String, String)>) -> Error {
    let (name, message) =
        described.unwrap_or_else(|| (hip_error_name(code), "no description (hipGetErrorString unavailable)".into()));
    Error::GpuCall { api: "HIP", call, code, name, message }
}

/// The error for a failed hipRTC call; `library_message` is hiprtcGetErrorString's text.
pub fn hiprtc_error(call: &'static str, code: i32, library_message: Option<String>) -> Error {
    let message = library_message.unwrap_or_else(|| "no description (hiprtcGetErrorString unavailable)".into());
    Error::GpuCall { api: "hipRTC", call, code, name: hiprtc_result_name(code), message }
}

/// The name of a `CUresult`, or `CUDA_ERROR_<code>` for a code this table does not know.
pub fn cu_result_name(code: i32) -> String {
    CU_RESULT_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("CUDA_ERROR_{code} (unknown to this build)"))
}

/// The name of an `nvrtcResult`.
pub fn nvrtc_result_name(code: i32) -> String {
    usize::try_from(code)
        .ok()
        .and_then(|i| NVRTC_RESULT_NAMES.get(i))
        .map(|n| n.to_string())
        .unwrap_or_else(|| format!("NVRTC_ERROR_{code} (unknown to this build)"))
}

/// The name and description of an `ncclResult_t`.
pub fn nccl_result_name(code: i32) -> (String, String) {
    usize::try_from(code)
        .ok()
        .and_then(|i| NCCL_RESULT_NAMES.get(i))
        .map(|(n, m)| (n.to_string(), m.to_string()))
        .unwrap_or_else(|| (format!("ncclResult {code}"), "unknown to this build".into()))
}

/// The error for a failed CUDA driver call. `described` is the driver's own (name, message)
/// from cuGetErrorName / cuGetErrorString, when it could give them.
pub fn cuda_error(call: &'static str, code: i32, described: Option<(String, String)>) -> Error {
    let (name, message) =
        described.unwrap_or_else(|| (cu_result_name(code), "no description (cuGetErrorString unavailable)".into()));
    Error::GpuCall { api: "CUDA driver", call, code, name, message }
}

/// The error for a failed NVRTC call; `message` is NVRTC's log or description.
pub fn nvrtc_error(call: &'static str, code: i32, message: String) -> Error {
    Error::GpuCall { api: "NVRTC", call, code, name: nvrtc_result_name(code), message }
}

/// The error for a failed NCCL/RCCL call; `api` names which, `library_message` is
/// ncclGetErrorString's text when the library gave it.
pub fn nccl_error(api: &'static str, call: &'static str, code: i32, library_message: Option<String>) -> Error {
    let (name, table_message) = nccl_result_name(code);
    Error::GpuCall { api, call, code, name, message: library_message.unwrap_or(table_message) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_cuda_codes_map_to_their_header_names() {
        for (code, name) in [
            (0, "CUDA_SUCCESS"),
            (1, "CUDA_ERROR_INVALID_VALUE"),
            (2, "CUDA_ERROR_OUT_OF_MEMORY"),
            (3, "CUDA_ERROR_NOT_INITIALIZED"),
            (34, "CUDA_ERROR_STUB_LIBRARY"),
            (100, "CUDA_ERROR_NO_DEVICE"),
            (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
            (218, "CUDA_ERROR_INVALID_PTX"),
            (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
            (500, "CUDA_ERROR_NOT_FOUND"),
            (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
            (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
            (719, "CUDA_ERROR_LAUNCH_FAILED"),
            (801, "CUDA_ERROR_NOT_SUPPORTED"),
            (999, "CUDA_ERROR_UNKNOWN"),
        ] {
            assert_eq!(cu_result_name(code), name);
        }
        assert!(cu_result_name(12345).contains("12345"));
        // The table is sorted and has no duplicate codes.
        assert!(CU_RESULT_NAMES.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn nvrtc_and_nccl_codes_map_to_their_header_names() {
        assert_eq!(nvrtc_result_name(0), "NVRTC_SUCCESS");
        assert_eq!(nvrtc_result_name(5), "NVRTC_ERROR_INVALID_OPTION");
        assert_eq!(nvrtc_result_name(6), "NVRTC_ERROR_COMPILATION");
        assert_eq!(nvrtc_result_name(18), "NVRTC_ERROR_BUSY");
        assert!(nvrtc_result_name(-1).contains("-1"));
        assert_eq!(nccl_result_name(1).0, "ncclUnhandledCudaError");
        assert_eq!(nccl_result_name(4).0, "ncclInvalidArgument");
        assert_eq!(nccl_result_name(8).0, "ncclTimeout");
        assert!(nccl_result_name(9).0.contains('9'));
    }

    #[test]
    fn hip_and_hiprtc_codes_map_to_their_header_names() {
        for (code, name) in [
            (0, "hipSuccess"),
            (1, "hipErrorInvalidValue"),
            (2, "hipErrorOutOfMemory"),
            (3, "hipErrorNotInitialized"),
            (98, "hipErrorInvalidDeviceFunction"),
            (100, "hipErrorNoDevice"),
            (101, "hipErrorInvalidDevice"),
            (209, "hipErrorNoBinaryForGpu"),
            (218, "hipErrorInvalidKernelFile"),
            (400, "hipErrorInvalidHandle"),
            (700, "hipErrorIllegalAddress"),
            (719, "hipErrorLaunchFailure"),
            (801, "hipErrorNotSupported"),
            (999, "hipErrorUnknown"),
            (1053, "hipErrorRuntimeOther"),
        ] {
            assert_eq!(hip_error_name(code), name);
        }
        assert!(hip_error_name(77).contains("77"));
        assert!(HIP_ERROR_NAMES.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(hiprtc_result_name(6), "HIPRTC_ERROR_COMPILATION");
        assert_eq!(hiprtc_result_name(100), "HIPRTC_ERROR_LINKING");
        assert!(hiprtc_result_name(12).contains("12"));
        assert!(HIPRTC_RESULT_NAMES.windows(2).all(|w| w[0].0 < w[1].0));
        let e = hip_error("hipInit", 100, None).to_string();
        assert!(e.starts_with("HIP: hipInit failed with hipErrorNoDevice (100): no description"), "{e}");
        let e = hiprtc_error("hiprtcCompileProgram", 6, Some("x.hip:1: error".into())).to_string();
        assert_eq!(e, "hipRTC: hiprtcCompileProgram failed with HIPRTC_ERROR_COMPILATION (6): x.hip:1: error");
    }

    #[test]
    fn a_failed_call_renders_as_one_line_naming_api_call_code_and_name() {
        let e = cuda_error("cuInit", 100, None);
        let line = e.to_string();
        assert!(line.starts_with("CUDA driver: cuInit failed with CUDA_ERROR_NO_DEVICE (100)"), "{line}");
        let e = cuda_error(
            "cuModuleLoadData",
            209,
            Some(("CUDA_ERROR_NO_BINARY_FOR_GPU".into(), "no kernel image is available".into())),
        );
        assert_eq!(
            e.to_string(),
            "CUDA driver: cuModuleLoadData failed with CUDA_ERROR_NO_BINARY_FOR_GPU (209): no kernel image is available"
        );
        let e = nvrtc_error("nvrtcCompileProgram", 6, "x.cu(1): error: expected a \";\"".into());
        assert!(e
            .to_string()
            .starts_with("NVRTC: nvrtcCompileProgram failed with NVRTC_ERROR_COMPILATION (6): x.cu(1)"));
        let e = nccl_error("NCCL", "ncclCommInitRank", 1, None);
        assert_eq!(
            e.to_string(),
            "NCCL: ncclCommInitRank failed with ncclUnhandledCudaError (1): unhandled cuda error"
        );
        assert!(!line.contains('\n'));
    }
}
