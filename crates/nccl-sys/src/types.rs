//! The C types of `nccl.h` and `cuda_runtime_api.h` that cross the boundary.
//!
//! C enums become `repr(transparent)` integer newtypes with associated constants: a library may
//! return a value this crate does not know (a newer error code, a dynamic reduction op), which a
//! Rust `enum` could not hold soundly.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclComm_t`: an opaque communicator handle.
pub type NcclComm = *mut c_void;
/// `cudaStream_t`: an opaque stream handle (NULL is the legacy default stream).
pub type CudaStream = *mut c_void;
/// `cudaEvent_t`: an opaque event handle.
pub type CudaEvent = *mut c_void;

/// `ncclResult_t`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclResult(pub c_int);

impl NcclResult {
    pub const SUCCESS: Self = Self(0);
    pub const UNHANDLED_CUDA_ERROR: Self = Self(1);
    pub const SYSTEM_ERROR: Self = Self(2);
    pub const INTERNAL_ERROR: Self = Self(3);
    pub const INVALID_ARGUMENT: Self = Self(4);
    pub const INVALID_USAGE: Self = Self(5);
    pub const REMOTE_ERROR: Self = Self(6);
    pub const IN_PROGRESS: Self = Self(7);

    /// The enumerator's name in `nccl.h`.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "ncclSuccess",
            1 => "ncclUnhandledCudaError",
            2 => "ncclSystemError",
            3 => "ncclInternalError",
            4 => "ncclInvalidArgument",
            5 => "ncclInvalidUsage",
            6 => "ncclRemoteError",
            7 => "ncclInProgress",
            _ => "unknown ncclResult_t",
        }
    }
}

/// `ncclDataType_t`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclDataType(pub c_int);

impl NcclDataType {
    pub const INT8: Self = Self(0);
    pub const UINT8: Self = Self(1);
    pub const INT32: Self = Self(2);
    pub const UINT32: Self = Self(3);
    pub const INT64: Self = Self(4);
    pub const UINT64: Self = Self(5);
    pub const FLOAT16: Self = Self(6);
    pub const FLOAT32: Self = Self(7);
    pub const FLOAT64: Self = Self(8);
    pub const BFLOAT16: Self = Self(9);
}

/// `ncclRedOp_t`: the built-in operators, or one made by `ncclRedOpCreatePreMulSum`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclRedOp(pub c_int);

impl NcclRedOp {
    pub const SUM: Self = Self(0);
    pub const PROD: Self = Self(1);
    pub const MAX: Self = Self(2);
    pub const MIN: Self = Self(3);
    pub const AVG: Self = Self(4);
}

/// `ncclScalarResidence_t`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclScalarResidence(pub c_int);

impl NcclScalarResidence {
    /// The scalar is read on the device while the collective runs.
    pub const DEVICE: Self = Self(0);
    /// The scalar is read on the host before `ncclRedOpCreate*` returns.
    pub const HOST_IMMEDIATE: Self = Self(1);
}

/// `NCCL_SPLIT_NOCOLOR`: the rank takes no part in the new communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclCommShrink`'s flags: shrink a healthy communicator, or abort its pending operations
/// first.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
pub const NCCL_SHRINK_ABORT: c_int = 1;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: the opaque bootstrap address rank 0 hands to the others.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl NcclUniqueId {
    pub fn zeroed() -> Self {
        NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }

    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        // Not `as`: c_char is i8 on x86_64 but u8 on aarch64, where clippy rejects the no-op cast.
        self.internal.map(|c| c.to_ne_bytes()[0])
    }

    /// `None` unless `bytes` is exactly [`NCCL_UNIQUE_ID_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let arr: [u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().ok()?;
        Some(NcclUniqueId {
            internal: arr.map(|b| c_char::from_ne_bytes([b])),
        })
    }
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclUniqueId(..)")
    }
}

/// `NCCL_CONFIG_UNDEF_INT`: "not set, use NCCL's default".
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_API_MAGIC`.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_VERSION(2, 29, 7)`: the `nccl.h` this layout is taken from. NCCL copies
/// `min(size, its own sizeof)` bytes and resets fields newer than `version` to their defaults,
/// so an older or newer library reads exactly the fields it shares with this layout.
pub const NCCL_CONFIG_VERSION: c_uint = 22907;

/// `ncclConfig_t` (`struct ncclConfig_v22800` of NCCL 2.29.7), field for field.
/// [`NcclConfig::default`] is `NCCL_CONFIG_INITIALIZER`: every attribute undefined.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfig {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
    pub graph_usage_mode: c_int,
    pub num_rma_ctx: c_int,
}

impl Default for NcclConfig {
    fn default() -> Self {
        const U: c_int = NCCL_CONFIG_UNDEF_INT;
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_CONFIG_VERSION,
            blocking: U,
            cga_cluster_size: U,
            min_ctas: U,
            max_ctas: U,
            net_name: std::ptr::null(),
            split_share: U,
            traffic_class: U,
            comm_name: std::ptr::null(),
            collnet_enable: U,
            cta_policy: U,
            shrink_share: U,
            nvls_ctas: U,
            n_channels_per_net_peer: U,
            nvlink_centric_sched: U,
            graph_usage_mode: U,
            num_rma_ctx: U,
        }
    }
}

/// `cudaError_t`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaError(pub c_int);

impl CudaError {
    pub const SUCCESS: Self = Self(0);
    pub const INSUFFICIENT_DRIVER: Self = Self(35);
    pub const NO_DEVICE: Self = Self(100);
    /// `cudaEventQuery`/`cudaStreamQuery`: the work is not finished yet (not an error).
    pub const NOT_READY: Self = Self(600);
}

/// `cudaMemcpyKind`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaMemcpyKind(pub c_int);

impl CudaMemcpyKind {
    pub const HOST_TO_DEVICE: Self = Self(1);
    pub const DEVICE_TO_HOST: Self = Self(2);
    pub const DEVICE_TO_DEVICE: Self = Self(3);
}

/// `cudaStreamNonBlocking`: no implicit synchronisation with the legacy default stream.
pub const CUDA_STREAM_NON_BLOCKING: c_uint = 0x01;
/// `cudaEventDisableTiming`: the cheapest event, for ordering and completion only.
pub const CUDA_EVENT_DISABLE_TIMING: c_uint = 0x02;
/// `cudaHostAllocPortable`: pinned memory usable from every CUDA context.
pub const CUDA_HOST_ALLOC_PORTABLE: c_uint = 0x01;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn config_layout_matches_nccl_h() {
        // Offsets of ncclConfig_t in NCCL 2.29.7's nccl.h on LP64 (checked against the header
        // with offsetof).
        assert_eq!(size_of::<NcclConfig>(), 88);
        assert_eq!(offset_of!(NcclConfig, magic), 8);
        assert_eq!(offset_of!(NcclConfig, version), 12);
        assert_eq!(offset_of!(NcclConfig, blocking), 16);
        assert_eq!(offset_of!(NcclConfig, net_name), 32);
        assert_eq!(offset_of!(NcclConfig, split_share), 40);
        assert_eq!(offset_of!(NcclConfig, comm_name), 48);
        assert_eq!(offset_of!(NcclConfig, collnet_enable), 56);
        assert_eq!(offset_of!(NcclConfig, num_rma_ctx), 84);
        let c = NcclConfig::default();
        assert_eq!((c.size, c.magic, c.version), (88, 0xcafe_beef, 22907));
        assert_eq!(c.blocking, i32::MIN);
        assert!(c.net_name.is_null() && c.comm_name.is_null());
    }

    #[test]
    fn unique_id_round_trips() {
        assert_eq!(size_of::<NcclUniqueId>(), 128);
        let bytes: Vec<u8> = (0..128u8).collect();
        let id = NcclUniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.to_bytes().to_vec(), bytes);
        assert!(NcclUniqueId::from_bytes(&bytes[..127]).is_none());
    }
}
