//! Parallel layouts: the rank grid and its process groups (`grid.rs`), the tensor-parallel
//! mappings used by the model (`tensor.rs`), SUMMA products for 2-D / 2.5-D tensor parallelism
//! (`summa.rs`), data-parallel gradient reduction (`data.rs`), and weights whose all-gathers are
//! still in flight (`arriving.rs`).

pub mod arriving;
pub mod context;
pub mod context_gather;
pub mod context_ring;
pub mod data;
pub mod grid;
pub mod pipeline;
pub mod summa;
pub mod tensor;
