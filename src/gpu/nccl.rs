//! NCCL (`libnccl.so.2`) and RCCL (`librccl.so`), which share one ABI, loaded at run time: the
//! entry-point table, `ncclUniqueId`, the datatype and reduction enums with their `nccl.h`
//! values, and the unique-id exchange over MPI that every NCCL communicator starts from (rank 0
//! creates the id, the Comm seam broadcasts its 128 bytes). `ncclGetVersion` and
//! `ncclGetUniqueId` need no GPU; the collectives need device memory and arrive with the CUDA
//! Device.

use super::dl::{api_table, candidates, Library};
use super::status::nccl_error;
use crate::comm::{Comm, Dtype, ReduceOp};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CStr};

/// `NCCL_UNIQUE_ID_BYTES` in `nccl.h`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: the opaque bootstrap address every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    pub internal: [u8; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(")?;
        for b in &self.internal[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "...)")
    }
}

/// `ncclComm_t`.
pub type NcclComm = *mut c_void;
/// `cudaStream_t` / `hipStream_t`.
pub type GpuStream = *mut c_void;

/// `ncclDataType_t` (`nccl.h`, NCCL 2.32).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl DataType {
    /// The NCCL type of a Comm seam element type.
    pub fn of(dtype: Dtype) -> DataType {
        match dtype {
            Dtype::F32 => DataType::Float32,
            Dtype::F64 => DataType::Float64,
            Dtype::Bf16 => DataType::Bfloat16,
            Dtype::F16 => DataType::Float16,
        }
    }
}

/// `ncclRedOp_t`'s built-in operations (`nccl.h`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl RedOp {
    pub fn of(op: ReduceOp) -> RedOp {
        match op {
            ReduceOp::Sum => RedOp::Sum,
            ReduceOp::Max => RedOp::Max,
        }
    }
}

api_table! {
    /// NCCL / RCCL entry points, as declared in `nccl.h`.
    NcclApi {
        fn ncclGetVersion(version: *mut i32) -> i32;
        fn ncclGetUniqueId(id: *mut UniqueId) -> i32;
        fn ncclCommInitRank(comm: *mut NcclComm, ranks: i32, id: UniqueId, rank: i32) -> i32;
        fn ncclCommDestroy(comm: NcclComm) -> i32;
        fn ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType, op: RedOp, comm: NcclComm, stream: GpuStream) -> i32;
        fn ncclAllGather(send: *const c_void, recv: *mut c_void, send_count: usize, dtype: DataType, comm: NcclComm, stream: GpuStream) -> i32;
        fn ncclReduceScatter(send: *const c_void, recv: *mut c_void, recv_count: usize, dtype: DataType, op: RedOp, comm: NcclComm, stream: GpuStream) -> i32;
        fn ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType, root: i32, comm: NcclComm, stream: GpuStream) -> i32;
        fn ncclSend(send: *const c_void, count: usize, dtype: DataType, peer: i32, comm: NcclComm, stream: GpuStream) -> i32;
        fn ncclRecv(recv: *mut c_void, count: usize, dtype: DataType, peer: i32, comm: NcclComm, stream: GpuStream) -> i32;
        fn ncclGroupStart() -> i32;
        fn ncclGroupEnd() -> i32;
        fn ncclGetErrorString(code: i32) -> *const c_char;
        fn ncclGetLastError(comm: NcclComm) -> *const c_char;
        fn ncclCommGetAsyncError(comm: NcclComm, error: *mut i32) -> i32;
        fn ncclCommAbort(comm: NcclComm) -> i32;
    }
}

/// Which library of the shared ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Nccl,
    Rccl,
}

impl Flavor {
    pub fn api(self) -> &'static str {
        match self {
            Flavor::Nccl => "NCCL",
            Flavor::Rccl => "RCCL",
        }
    }
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            Flavor::Nccl => &["libnccl.so.2"],
            Flavor::Rccl => &["librccl.so.1", "librccl.so"],
        }
    }
    /// The variable that names the library file instead.
    pub fn env_var(self) -> &'static str {
        match self {
            Flavor::Nccl => "TRIDENT_NCCL",
            Flavor::Rccl => "TRIDENT_RCCL",
        }
    }
}

pub struct Nccl {
    pub flavor: Flavor,
    pub api: NcclApi,
}

impl Nccl {
    /// Opens the flavor's library: the file its variable names, else its sonames.
    pub fn load(flavor: Flavor) -> Result<Nccl> {
        Nccl::open(flavor, &candidates(flavor.env_var(), flavor.sonames()))
    }

    /// Opens the first of `files` (sonames or paths) that loads, as `flavor`.
    pub fn open(flavor: Flavor, files: &[String]) -> Result<Nccl> {
        let hint = match flavor {
            Flavor::Nccl => "not on the library path; set TRIDENT_NCCL to a libnccl.so.2, which `pip install nvidia-nccl-cu13` provides",
            Flavor::Rccl => "not on the library path; set TRIDENT_RCCL to ROCm's librccl.so",
        };
        let lib = Library::open_first(files, hint)?;
        Ok(Nccl { flavor, api: NcclApi::new(lib.locate("ncclGetVersion")) })
    }

    pub fn path(&self) -> String {
        self.api.lib.shown_name()
    }

    pub fn check(&self, call: &'static str, code: i32) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a pointer to a static string, copied at once.
        let message = match unsafe { self.api.ncclGetErrorString(code) } {
            // SAFETY: non-null, NUL-terminated, owned by the library.
            Ok(p) if !p.is_null() => Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()),
            _ => None,
        };
        Err(nccl_error(self.flavor.api(), call, code, message))
    }

    /// As `check`, with the library's last error text (`ncclGetLastError`, NCCL >= 2.13) added
    /// when the library has it and it says something.
    pub(crate) fn check_comm(&self, call: &'static str, code: i32, comm: NcclComm) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a pointer to a thread-local or static string, copied at once.
        let last = match unsafe { self.api.ncclGetLastError(comm) } {
            // SAFETY: non-null, NUL-terminated, owned by the library.
            Ok(p) if !p.is_null() => unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string(),
            _ => String::new(),
        };
        match self.check(call, code) {
            Err(Error::GpuCall { api, call, code, name, message }) if !last.is_empty() => {
                Err(Error::GpuCall { api, call, code, name, message: format!("{message}: {last}") })
            }
            other => other,
        }
    }

    /// The library's version code (NCCL >= 2.9: major * 10000 + minor * 100 + patch).
    pub fn version_code(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("ncclGetVersion", unsafe { self.api.ncclGetVersion(&mut v) }?)?;
        Ok(v)
    }

    /// The version as "2.32.3".
    pub fn version(&self) -> Result<String> {
        Ok(version_string(self.version_code()?))
    }

    /// A new unique id (opens a bootstrap socket; needs no GPU).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; UNIQUE_ID_BYTES] };
        // SAFETY: writes 128 bytes into id.
        self.check("ncclGetUniqueId", unsafe { self.api.ncclGetUniqueId(&mut id) }?)?;
        Ok(id)
    }
}

/// "major.minor.patch" of a version code, in either of NCCL's encodings (before 2.9: x1000 + x100).
pub fn version_string(code: i32) -> String {
    if code >= 20900 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// Every rank of `comm` gets the unique id that rank 0 makes with `make` (rank 0 calls
/// ncclGetUniqueId, the Comm seam broadcasts the 128 bytes). A failure on rank 0 travels with the
/// broadcast, so every rank returns an error instead of waiting for an id that never comes.
pub fn exchange_unique_id(comm: &dyn Comm, make: impl FnOnce() -> Result<UniqueId>) -> Result<UniqueId> {
    let size = comm.size();
    pass_unique_id((comm.rank() == 0).then_some(make), "rank 0", |message| {
        if size > 1 {
            comm.broadcast_bytes(message, Dtype::F32, 0);
        }
    })
}

/// The unique id that one rank makes (`make` is Some there) and `carry` moves to the others
/// (a broadcast, a send to one peer), with a status word in front: a failure where the id is
/// made travels with it, so a receiving rank returns an error naming `maker` instead of waiting.
pub fn pass_unique_id(
    make: Option<impl FnOnce() -> Result<UniqueId>>,
    maker: &str,
    carry: impl FnOnce(&mut [u8]),
) -> Result<UniqueId> {
    // Four status bytes keep the message a whole number of f32 for the byte-level broadcast.
    let mut message = [0u8; 4 + UNIQUE_ID_BYTES];
    let mut local_error = None;
    if let Some(make) = make {
        match make() {
            Ok(id) => {
                message[0] = 1;
                message[4..].copy_from_slice(&id.internal);
            }
            Err(e) => local_error = Some(e),
        }
    }
    carry(&mut message);
    if let Some(e) = local_error {
        return Err(e);
    }
    if message[0] != 1 {
        return Err(Error::Comm(format!(
            "{maker} could not create the NCCL unique id (its error is printed by that rank)"
        )));
    }
    let mut id = UniqueId { internal: [0; UNIQUE_ID_BYTES] };
    id.internal.copy_from_slice(&message[4..]);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SelfComm;

    #[test]
    fn enum_values_are_the_abi_values_of_nccl_h() {
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
        assert_eq!(std::mem::size_of::<DataType>(), 4);
        assert_eq!(DataType::of(Dtype::F32) as i32, 7);
        assert_eq!(DataType::of(Dtype::F64) as i32, 8);
        assert_eq!(DataType::of(Dtype::Bf16) as i32, 9);
        assert_eq!(DataType::of(Dtype::F16) as i32, 6);
        assert_eq!(RedOp::of(ReduceOp::Sum) as i32, 0);
        assert_eq!(RedOp::of(ReduceOp::Max) as i32, 2);
        assert_eq!(RedOp::Avg as i32, 4);
    }

    #[test]
    fn version_codes_read_in_both_encodings() {
        assert_eq!(version_string(23203), "2.32.3");
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(2804), "2.8.4");
    }

    #[test]
    fn a_group_of_one_keeps_its_own_id_and_reports_a_failure() {
        let id = UniqueId { internal: [7; 128] };
        assert_eq!(exchange_unique_id(&SelfComm, || Ok(id)).unwrap(), id);
        let e = exchange_unique_id(&SelfComm, || Err(nccl_error("NCCL", "ncclGetUniqueId", 2, None))).unwrap_err();
        assert!(e.to_string().contains("ncclGetUniqueId failed with ncclSystemError"), "{e}");
    }
}
