//! Device memory over any `GpuRuntime`: `DeviceMem`, an allocation freed on drop that holds an
//! `Arc` of its runtime (so the context outlives every buffer), and `GpuBuf`, the GPU Device's
//! buffer of typed elements (`Elem`: f32 or bf16 for the ops, 16-bit for saved activations, f64
//! for the step's scalars). Also `GpuP2p`, what the Device asks of its pipeline links beyond the Device
//! seam's `DeviceP2p`, so that the links (collectives.rs) and the Device (device.rs) meet here
//! instead of importing each other.

use super::kernels::Storage;
use super::runtime::GpuRuntime;
use crate::comm::Dtype;
use crate::device::DeviceP2p;
use crate::error::Result;
use std::sync::Arc;

/// A device allocation of `bytes`, freed on drop.
pub struct DeviceMem {
    rt: Arc<dyn GpuRuntime>,
    pub(super) pointer: u64,
    pub(super) bytes: usize,
}

impl DeviceMem {
    pub fn alloc(rt: &Arc<dyn GpuRuntime>, bytes: usize) -> Result<DeviceMem> {
        // A zero-byte request is legal for the Device but not for cuMemAlloc: it holds no memory.
        let pointer = if bytes == 0 { 0 } else { rt.alloc(bytes)? };
        Ok(DeviceMem { rt: rt.clone(), pointer, bytes })
    }

    /// The device address (0 for an empty allocation).
    pub fn pointer(&self) -> u64 {
        self.pointer
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.pointer != 0 {
            self.rt.free(self.pointer, self.bytes);
        }
    }
}

/// What a `GpuBuf` holds. The Device's ops take f32 and 16-bit buffers of its storage type
/// (`alloc_in` under `--bf16`: bf16, under `--fp16`: binary16 `F16`; the activations, their
/// gradients and the GEMMs' working weights); the seam's 16-bit copies of f32 buffers
/// (`Memory::to_half`, bf16 or f16 bits) are `Bits16` (training on 16-bit storage stashes none),
/// and the step's scalars are f64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    Bf16,
    F16,
    Bits16,
    F64,
}

impl Elem {
    /// The element type of `storage`'s 16-bit buffers.
    pub fn of(storage: Storage) -> Elem {
        match storage {
            Storage::Bf16 => Elem::Bf16,
            Storage::F16 => Elem::F16,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Elem::Bf16 | Elem::F16 | Elem::Bits16 => 2,
            Elem::F32 => 4,
            Elem::F64 => 8,
        }
    }
}

/// The GPU Device's buffer: `len` elements of `elem` in device memory.
pub struct GpuBuf {
    pub(super) mem: DeviceMem,
    pub(super) len: usize,
    pub(super) elem: Elem,
}

impl GpuBuf {
    /// `len` elements of `elem`, uninitialised (the allocation rounded up to whole 4-byte words).
    pub(super) fn uninit(rt: &Arc<dyn GpuRuntime>, len: usize, elem: Elem) -> Result<GpuBuf> {
        let mem = DeviceMem::alloc(rt, (elem.bytes() * len).next_multiple_of(4))?;
        Ok(GpuBuf { mem, len, elem })
    }

    /// `len` elements of `elem`, zero-filled.
    pub(super) fn zeroed(rt: &Arc<dyn GpuRuntime>, len: usize, elem: Elem) -> Result<GpuBuf> {
        let buf = GpuBuf::uninit(rt, len, elem)?;
        let words = buf.mem.bytes / 4;
        if words > 0 {
            rt.memset_u32(buf.mem.pointer, 0, words)?;
        }
        Ok(buf)
    }
    pub(crate) fn ptr(&self) -> u64 {
        self.mem.pointer
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The NCCL / MPI type of the elements: f32, or the 16-bit storage (`Memory::alloc_in`: bf16
    /// under `--bf16`, binary16 under `--fp16`). The model reduces 16-bit buffers only where the
    /// sum is exact (the word embedding's rows: one rank's non-zero per element, the others'
    /// zeros); its reductions of partial products (a row-parallel layer's output, a LayerNorm
    /// input's gradient) and of gradients run on f32 buffers, the cross-entropy's statistics on
    /// f64. Gathers, broadcasts and pipeline messages move 16-bit elements as they are.
    pub(crate) fn dtype(&self) -> Dtype {
        match self.elem {
            Elem::F32 => Dtype::F32,
            Elem::Bf16 => Dtype::Bf16,
            Elem::F16 => Dtype::F16,
            e => panic!("collectives on device buffers take f32 or 16-bit storage buffers, not {e:?}"),
        }
    }

    /// The type of a collective between this buffer and `other`, which must agree.
    pub(crate) fn dtype_with(&self, other: &GpuBuf) -> Dtype {
        assert_eq!(self.elem, other.elem, "a collective between buffers of different element types");
        self.dtype()
    }
}

/// The GPU Device's pipeline links: `DeviceP2p` on its buffers, and `settle_receives`, which the
/// Device calls before the host reads device memory: every receive enqueued so far has arrived
/// (polled, so a dead peer ends the run with an error instead of a hang in the copy). A send is
/// not waited for there: its peer may post the matching receive only later.
pub trait GpuP2p: DeviceP2p<GpuBuf> + Send + Sync {
    fn settle_receives(&self);
}
