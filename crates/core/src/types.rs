//! Element types, reduction operators and collective kinds, with stable wire codes.

use crate::error::{Error, Result};

/// Element type of a buffer. The discriminant is the wire code.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32 = 0,
    F64 = 1,
    F16 = 2,
    BF16 = 3,
    I8 = 4,
    I16 = 5,
    I32 = 6,
    I64 = 7,
    U8 = 8,
    Bool = 9,
    C64 = 10,
    C128 = 11,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
        DType::C64,
        DType::C128,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The torch name (`torch.float32` is `float32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    pub fn from_code(code: u8) -> Result<Self> {
        DType::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::Type(format!("unknown dtype code {code}")))
    }

    pub fn from_name(name: &str) -> Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::Type(format!("unsupported dtype {name}")))
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }
}

/// Reduction operator. The discriminant is the wire code.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum = 0,
    Product = 1,
    Min = 2,
    Max = 3,
    Band = 4,
    Bor = 5,
    Bxor = 6,
    Avg = 7,
    PremulSum = 8,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Band,
        ReduceOp::Bor,
        ReduceOp::Bxor,
        ReduceOp::Avg,
        ReduceOp::PremulSum,
    ];

    /// The torch name (`ReduceOp.SUM` is `SUM`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Product => "PRODUCT",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
            ReduceOp::Band => "BAND",
            ReduceOp::Bor => "BOR",
            ReduceOp::Bxor => "BXOR",
            ReduceOp::Avg => "AVG",
            ReduceOp::PremulSum => "PREMUL_SUM",
        }
    }

    pub fn from_code(code: u8) -> Result<Self> {
        ReduceOp::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::invalid(format!("unknown reduce op code {code}")))
    }
}

/// Which collective a message belongs to; carried in every frame header so that ranks calling
/// different collectives are caught instead of exchanging mismatched bytes.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce = 0,
    Broadcast = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Barrier = 4,
    SendRecv = 5,
    Reduce = 6,
    Gather = 7,
    Scatter = 8,
    AllToAll = 9,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 10] = [
        CollectiveKind::AllReduce,
        CollectiveKind::Broadcast,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Barrier,
        CollectiveKind::SendRecv,
        CollectiveKind::Reduce,
        CollectiveKind::Gather,
        CollectiveKind::Scatter,
        CollectiveKind::AllToAll,
    ];

    /// The torch function name, used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::SendRecv => "send/recv",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::Gather => "gather",
            CollectiveKind::Scatter => "scatter",
            CollectiveKind::AllToAll => "all_to_all",
        }
    }

    /// The kind with torch name `name` (as [`CollectiveKind::name`] spells it).
    pub fn from_name(name: &str) -> Result<Self> {
        CollectiveKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| Error::invalid(format!("unknown collective {name:?}")))
    }

    pub fn from_code(code: u8) -> Result<Self> {
        CollectiveKind::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::network(format!("unknown collective code {code}")))
    }
}
