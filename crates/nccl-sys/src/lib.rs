//! NCCL + CUDA runtime FFI, loaded at run time.
//!
//! Placeholder: the CUDA path is a later issue. Kept in the workspace so the layout is fixed.
