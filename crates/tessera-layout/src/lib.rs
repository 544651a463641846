//! Stripe geometry, redundancy schemes and transfer plans.
//!
//! This crate owns the arithmetic of where a file's bytes live: how a file is cut into stripe
//! units, how those units and their redundancy (parity or mirror copies) are laid over the
//! columns of a layout's width, and how a write becomes a [`WritePlan`]: per stripe, which
//! pieces move and by which method (plain, mirrored, full-stripe parity, read-modify-write, or
//! CSAR's overflow regions). It is pure: no I/O, no clocks, no randomness. Columns are indices
//! `0..width` into the list of servers a file was given; mapping them to real servers is the
//! caller's business.
//!
//! Placement follows CSAR figure 2, which is the left-symmetric RAID-5 layout: global data
//! block `b` lives on column `b mod W` at local index `b / W` (the plain striping layout), and
//! the parity of stripe `s` lives on column `W-1 - (s mod W)` at local index `s / W` of that
//! column's redundancy file. RAID-4 keeps data on columns `0..W-1` and parity on column `W-1`.
//! RAID-1 places a mirror of block `b` on column `(b+1) mod W`, in the redundancy file.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// Smallest stripe unit accepted: one file-system block.
pub const STRIPE_UNIT_BYTES_MIN: u32 = 4096;
/// Largest stripe unit accepted; bounds message and buffer sizes everywhere above.
pub const STRIPE_UNIT_BYTES_MAX: u32 = 4 << 20;
/// Default stripe unit (64 KiB).
pub const STRIPE_UNIT_BYTES_DEFAULT: u32 = 64 << 10;
/// Widest layout accepted.
pub const WIDTH_MAX: u32 = 256;
/// Largest byte offset (exclusive) of a column's data or redundancy file: 1 TiB. A storage
/// server refuses anything past it (`tessera_store::FILE_BYTES_MAX` is this), so a file holds
/// at most [`Layout::file_bytes_max`] bytes.
pub const COLUMN_BYTES_MAX: u64 = 1 << 40;

/// A redundancy scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Scheme {
    /// Striping without redundancy.
    Raid0,
    /// Striped mirroring: each stripe unit has a copy on the next column.
    Raid1,
    /// Parity on one fixed column (the last of the width).
    Raid4,
    /// Parity rotating over the columns (left-symmetric, CSAR figure 2).
    Raid5,
    /// CSAR Hybrid: full stripes as RAID-5, partial stripes mirrored into overflow regions.
    Hybrid,
}

impl Scheme {
    /// All schemes, in the order tables list them.
    pub const ALL: [Scheme; 5] = [
        Scheme::Raid0,
        Scheme::Raid1,
        Scheme::Raid4,
        Scheme::Raid5,
        Scheme::Hybrid,
    ];

    /// The scheme's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Raid0 => "raid0",
            Scheme::Raid1 => "raid1",
            Scheme::Raid4 => "raid4",
            Scheme::Raid5 => "raid5",
            Scheme::Hybrid => "hybrid",
        }
    }

    /// Whether the scheme survives the loss of one column.
    pub fn is_redundant(self) -> bool {
        self != Scheme::Raid0
    }

    /// Whether stripes carry a parity unit.
    pub fn has_parity(self) -> bool {
        matches!(self, Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid)
    }

    /// Smallest width the scheme accepts.
    pub fn width_min(self) -> u32 {
        match self {
            Scheme::Raid0 => 1,
            Scheme::Raid1 => 2,
            _ => 3,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scheme::ALL
            .into_iter()
            .find(|scheme| scheme.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| LayoutError::UnknownScheme(s.to_string()))
    }
}

/// Errors in describing a layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The scheme name is not one of raid0, raid1, raid4, raid5, hybrid.
    #[error("unknown scheme '{0}' (expected raid0, raid1, raid4, raid5 or hybrid)")]
    UnknownScheme(String),
    /// The width is outside what the scheme accepts.
    #[error("width {width} is not allowed for {scheme} (needs {min} to {max} servers)")]
    Width {
        /// Requested width.
        width: u32,
        /// Scheme asked for.
        scheme: Scheme,
        /// Smallest allowed width.
        min: u32,
        /// Largest allowed width.
        max: u32,
    },
    /// The stripe unit is not a power-of-two multiple of 4 KiB within bounds.
    #[error("stripe unit {0} bytes is not a power of two between 4 KiB and 4 MiB")]
    StripeUnit(u32),
}

/// Which of a server's two per-file base files a slot is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Region {
    /// The data file: stripe units of the file's contents.
    Data,
    /// The redundancy file: parity units (RAID-4/5, Hybrid) or mirror copies (RAID-1).
    Redundancy,
}

/// Whether an overflow entry is the primary copy (on the data block's column) or the mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum OverflowRole {
    /// Held by the column that holds the data block.
    Primary,
    /// Held by the next column, as the redundant copy.
    Mirror,
}

/// One stripe-unit-sized place on one column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Index into the layout's width (which server).
    pub column: u32,
    /// Data or redundancy file.
    pub region: Region,
    /// Index of the stripe unit within that file.
    pub local_index: u64,
}

/// How a file is laid out: scheme, stripe unit and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// Redundancy scheme.
    pub scheme: Scheme,
    /// Bytes per stripe unit.
    pub stripe_unit: u32,
    /// Number of columns (servers).
    pub width: u32,
}

/// The part of one data block that an access touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Global index of the data block (stripe unit of file contents).
    pub block: u64,
    /// First byte within the stripe unit.
    pub offset_in_unit: u32,
    /// Bytes touched.
    pub len: u32,
    /// Where these bytes sit in the caller's buffer.
    pub buf_offset: u64,
}

impl Piece {
    /// Range of the caller's buffer that this piece covers.
    pub fn buf_range(&self) -> Range<usize> {
        self.buf_offset as usize..(self.buf_offset + self.len as u64) as usize
    }

    /// Range within the stripe unit.
    pub fn unit_range(&self) -> Range<usize> {
        self.offset_in_unit as usize..(self.offset_in_unit + self.len) as usize
    }
}

/// The pieces of one access that fall within one stripe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeExtent {
    /// Stripe index.
    pub stripe: u64,
    /// Whether the access covers every data byte of the stripe.
    pub full: bool,
    /// Touched pieces, in block order.
    pub pieces: Vec<Piece>,
}

/// How one stripe of a write is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMethod {
    /// RAID-0: data only.
    Plain,
    /// RAID-1: data and a mirror copy on the next column.
    Mirrored,
    /// Whole stripe: data units plus freshly computed parity.
    FullStripeParity,
    /// Partial stripe under RAID-4/5: lock and read old parity and old data, write new data and
    /// new parity (`P' = P ^ D ^ D'`).
    ReadModifyWrite,
    /// Partial stripe under Hybrid: primary and mirror copies into overflow regions; base data and
    /// parity untouched.
    Overflow,
}

/// One stripe's share of a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeWrite {
    /// The stripe and the pieces written in it.
    pub extent: StripeExtent,
    /// How the stripe is written.
    pub method: WriteMethod,
}

/// A write turned into per-stripe work. See [`Layout::plan_write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// File offset of the first byte written.
    pub offset: u64,
    /// Bytes written.
    pub len: u64,
    /// Stripes in ascending order: locks are taken in this order, lower-numbered stripe first.
    pub stripes: Vec<StripeWrite>,
}

/// One operation that a write plan asks of one column, in the order the column receives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerOp {
    /// Lock the parity unit of a stripe and read it (the lock is held until `WriteParity`).
    LockReadParity {
        /// Stripe whose parity is locked.
        stripe: u64,
    },
    /// Read the old base bytes of a piece (for read-modify-write).
    ReadOld {
        /// The piece whose old contents are read.
        piece: Piece,
    },
    /// Write a piece's bytes into a slot of the data or redundancy file.
    Write {
        /// Where the bytes go.
        slot: Slot,
        /// The piece written.
        piece: Piece,
    },
    /// Write a stripe's parity (releasing its lock after a read-modify-write).
    WriteParity {
        /// Stripe whose parity is written.
        stripe: u64,
    },
    /// Append a piece to the column's overflow region.
    WriteOverflow {
        /// Primary or mirror copy.
        role: OverflowRole,
        /// The piece written.
        piece: Piece,
    },
    /// Drop overflow entries for blocks that a full-stripe write has just rewritten.
    InvalidateOverflow {
        /// Primary or mirror entries.
        role: OverflowRole,
        /// Blocks whose entries are dropped.
        blocks: Range<u64>,
    },
}

/// What a column stores for one stripe: rebuild and scrub walk these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StripeMember {
    /// The column holds data block `block` in its data file.
    Data {
        /// Global data block index.
        block: u64,
    },
    /// The column holds the stripe's parity.
    Parity,
    /// The column holds the mirror copy of `block` (RAID-1).
    Mirror {
        /// Global data block index.
        block: u64,
    },
}

impl Layout {
    /// A checked layout.
    pub fn new(scheme: Scheme, stripe_unit: u32, width: u32) -> Result<Layout, LayoutError> {
        if !(STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&stripe_unit)
            || !stripe_unit.is_power_of_two()
        {
            return Err(LayoutError::StripeUnit(stripe_unit));
        }
        if width < scheme.width_min() || width > WIDTH_MAX {
            return Err(LayoutError::Width {
                width,
                scheme,
                min: scheme.width_min(),
                max: WIDTH_MAX,
            });
        }
        Ok(Layout {
            scheme,
            stripe_unit,
            width,
        })
    }

    /// Data blocks per stripe.
    pub fn data_per_stripe(&self) -> u32 {
        if self.scheme.has_parity() {
            self.width - 1
        } else {
            self.width
        }
    }

    /// Data bytes per stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.data_per_stripe() as u64 * self.stripe_unit as u64
    }

    /// Stripe that holds data block `block`.
    pub fn stripe_of_block(&self, block: u64) -> u64 {
        block / self.data_per_stripe() as u64
    }

    /// Data blocks of stripe `stripe`.
    pub fn blocks_of_stripe(&self, stripe: u64) -> Range<u64> {
        let d = self.data_per_stripe() as u64;
        stripe * d..(stripe + 1) * d
    }

    /// Largest size of a file with this layout: as many stripes as a column's file holds
    /// stripe units. Every slot of stripe `s` has a local index of at most `s` (data block
    /// `b < (s+1)·d` sits at `b / W` or, under RAID-4, at `s`; parity at `s / W` or `s`), so
    /// every byte of such a file lies within [`COLUMN_BYTES_MAX`] on its column. That is 1 TiB
    /// per data column whatever the stripe unit: `W` TiB under RAID-0 and RAID-1, `W-1` TiB
    /// under the parity schemes.
    pub fn file_bytes_max(&self) -> u64 {
        (COLUMN_BYTES_MAX / u64::from(self.stripe_unit)) * self.stripe_bytes()
    }

    /// The stripe whose member sits at local index `local_index` of `region` on `column`, if
    /// a member of some stripe sits there. Monotone in `local_index`, so a range of local
    /// indices maps to a range of stripes (scrub and rebuild use it to walk only the stripes
    /// that hold allocated bytes).
    pub fn stripe_of_local(&self, column: u32, region: Region, local_index: u64) -> Option<u64> {
        let w = u64::from(self.width);
        let c = u64::from(column);
        match (self.scheme, region) {
            (Scheme::Raid4, Region::Data) => (c < w - 1).then_some(local_index),
            (_, Region::Data) => Some(self.stripe_of_block(local_index * w + c)),
            (Scheme::Raid4, Region::Redundancy) => (c == w - 1).then_some(local_index),
            (Scheme::Raid5 | Scheme::Hybrid, Region::Redundancy) => {
                Some(local_index * w + (w - 1 - c))
            }
            // The mirror of block `b` sits on the column after `b`'s, at the same local index.
            (Scheme::Raid1, Region::Redundancy) => {
                Some(self.stripe_of_block(local_index * w + (c + w - 1) % w))
            }
            (Scheme::Raid0, Region::Redundancy) => None,
        }
    }

    /// The first local index of `region` on `column` whose member belongs to `stripe` or a
    /// later one (`None` if the region holds nothing there, as RAID-0's redundancy). Since
    /// [`stripe_of_local`](Self::stripe_of_local) is monotone, everything a column stores of
    /// the stripes from `stripe` on lies at or past this index: cutting each column's files
    /// there discards exactly those stripes (a truncation's discard).
    pub fn first_local_of_stripe(&self, column: u32, region: Region, stripe: u64) -> Option<u64> {
        let end = COLUMN_BYTES_MAX / u64::from(self.stripe_unit);
        let at_or_past = |index: u64| {
            self.stripe_of_local(column, region, index)
                .is_some_and(|found| found >= stripe)
        };
        // A region this column holds nothing of answers `None` for every index.
        self.stripe_of_local(column, region, 0)?;
        let (mut low, mut high) = (0u64, end);
        while low < high {
            let middle = low + (high - low) / 2;
            if at_or_past(middle) {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        Some(low)
    }

    /// Number of stripes that hold a file of `size` bytes.
    pub fn stripes_for_size(&self, size: u64) -> u64 {
        size.div_ceil(self.stripe_bytes())
    }

    /// Byte offset within its file of a slot.
    pub fn local_offset(&self, slot: Slot) -> u64 {
        slot.local_index * self.stripe_unit as u64
    }

    /// Where data block `block` lives.
    pub fn data_slot(&self, block: u64) -> Slot {
        let w = self.width as u64;
        let (column, local_index) = match self.scheme {
            Scheme::Raid4 => (block % (w - 1), block / (w - 1)),
            _ => (block % w, block / w),
        };
        Slot {
            column: column as u32,
            region: Region::Data,
            local_index,
        }
    }

    /// Where the parity of `stripe` lives, for schemes with parity.
    pub fn parity_slot(&self, stripe: u64) -> Option<Slot> {
        let w = self.width as u64;
        match self.scheme {
            Scheme::Raid4 => Some(Slot {
                column: self.width - 1,
                region: Region::Redundancy,
                local_index: stripe,
            }),
            Scheme::Raid5 | Scheme::Hybrid => Some(Slot {
                column: (w - 1 - stripe % w) as u32,
                region: Region::Redundancy,
                local_index: stripe / w,
            }),
            Scheme::Raid0 | Scheme::Raid1 => None,
        }
    }

    /// Where the mirror copy of `block` lives, for RAID-1.
    pub fn mirror_slot(&self, block: u64) -> Option<Slot> {
        (self.scheme == Scheme::Raid1).then(|| {
            let data = self.data_slot(block);
            Slot {
                column: (data.column + 1) % self.width,
                region: Region::Redundancy,
                local_index: data.local_index,
            }
        })
    }

    /// Column holding the mirror copy of a block's overflow entries (Hybrid).
    pub fn overflow_column(&self, block: u64, role: OverflowRole) -> u32 {
        let data = self.data_slot(block).column;
        match role {
            OverflowRole::Primary => data,
            OverflowRole::Mirror => (data + 1) % self.width,
        }
    }

    /// What column `column` stores for `stripe`.
    pub fn members_on_column(&self, stripe: u64, column: u32) -> Vec<StripeMember> {
        let mut members = Vec::new();
        for block in self.blocks_of_stripe(stripe) {
            if self.data_slot(block).column == column {
                members.push(StripeMember::Data { block });
            }
            if self.mirror_slot(block).is_some_and(|m| m.column == column) {
                members.push(StripeMember::Mirror { block });
            }
        }
        if self.parity_slot(stripe).is_some_and(|p| p.column == column) {
            members.push(StripeMember::Parity);
        }
        members
    }

    /// Cut the byte range `[offset, offset+len)` into per-stripe pieces.
    pub fn split(&self, offset: u64, len: u64) -> Vec<StripeExtent> {
        let unit = self.stripe_unit as u64;
        let stripe_bytes = self.stripe_bytes();
        let end = offset + len;
        let mut extents: Vec<StripeExtent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let block = pos / unit;
            let offset_in_unit = pos % unit;
            let take = (unit - offset_in_unit).min(end - pos);
            let stripe = self.stripe_of_block(block);
            let piece = Piece {
                block,
                offset_in_unit: offset_in_unit as u32,
                len: take as u32,
                buf_offset: pos - offset,
            };
            match extents.last_mut() {
                Some(extent) if extent.stripe == stripe => extent.pieces.push(piece),
                _ => extents.push(StripeExtent {
                    stripe,
                    full: false,
                    pieces: vec![piece],
                }),
            }
            pos += take;
        }
        for extent in &mut extents {
            let start = extent.stripe * stripe_bytes;
            extent.full = offset <= start && end >= start + stripe_bytes;
        }
        extents
    }

    /// Turn a write of `len` bytes at `offset` into a transfer plan.
    pub fn plan_write(&self, offset: u64, len: u64) -> WritePlan {
        let stripes = self
            .split(offset, len)
            .into_iter()
            .map(|extent| {
                let method = match (self.scheme, extent.full) {
                    (Scheme::Raid0, _) => WriteMethod::Plain,
                    (Scheme::Raid1, _) => WriteMethod::Mirrored,
                    (Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid, true) => {
                        WriteMethod::FullStripeParity
                    }
                    (Scheme::Raid4 | Scheme::Raid5, false) => WriteMethod::ReadModifyWrite,
                    (Scheme::Hybrid, false) => WriteMethod::Overflow,
                };
                StripeWrite { extent, method }
            })
            .collect();
        WritePlan {
            offset,
            len,
            stripes,
        }
    }

    /// The operations each column runs for a plan, in order, keyed by column.
    ///
    /// This is the plan as the servers see it; the client runs the columns in parallel and, for
    /// read-modify-write, the reads before the writes.
    pub fn server_ops(&self, plan: &WritePlan) -> Vec<Vec<ServerOp>> {
        let mut ops: Vec<Vec<ServerOp>> = vec![Vec::new(); self.width as usize];
        for stripe_write in &plan.stripes {
            let extent = &stripe_write.extent;
            let stripe = extent.stripe;
            match stripe_write.method {
                WriteMethod::Plain | WriteMethod::Mirrored => {
                    for piece in &extent.pieces {
                        let slot = self.data_slot(piece.block);
                        ops[slot.column as usize].push(ServerOp::Write {
                            slot,
                            piece: *piece,
                        });
                        if let Some(mirror) = self.mirror_slot(piece.block) {
                            ops[mirror.column as usize].push(ServerOp::Write {
                                slot: mirror,
                                piece: *piece,
                            });
                        }
                    }
                }
                WriteMethod::FullStripeParity => {
                    for piece in &extent.pieces {
                        let slot = self.data_slot(piece.block);
                        ops[slot.column as usize].push(ServerOp::Write {
                            slot,
                            piece: *piece,
                        });
                    }
                    let parity = self.parity_slot(stripe).expect("parity scheme");
                    ops[parity.column as usize].push(ServerOp::WriteParity { stripe });
                    if self.scheme == Scheme::Hybrid {
                        for block in self.blocks_of_stripe(stripe) {
                            for role in [OverflowRole::Primary, OverflowRole::Mirror] {
                                let column = self.overflow_column(block, role);
                                ops[column as usize].push(ServerOp::InvalidateOverflow {
                                    role,
                                    blocks: block..block + 1,
                                });
                            }
                        }
                    }
                }
                WriteMethod::ReadModifyWrite => {
                    let parity = self.parity_slot(stripe).expect("parity scheme");
                    ops[parity.column as usize].push(ServerOp::LockReadParity { stripe });
                    for piece in &extent.pieces {
                        let slot = self.data_slot(piece.block);
                        ops[slot.column as usize].push(ServerOp::ReadOld { piece: *piece });
                    }
                    for piece in &extent.pieces {
                        let slot = self.data_slot(piece.block);
                        ops[slot.column as usize].push(ServerOp::Write {
                            slot,
                            piece: *piece,
                        });
                    }
                    ops[parity.column as usize].push(ServerOp::WriteParity { stripe });
                }
                WriteMethod::Overflow => {
                    for piece in &extent.pieces {
                        for role in [OverflowRole::Primary, OverflowRole::Mirror] {
                            let column = self.overflow_column(piece.block, role);
                            ops[column as usize].push(ServerOp::WriteOverflow {
                                role,
                                piece: *piece,
                            });
                        }
                    }
                }
            }
        }
        ops
    }
}

#[cfg(test)]
mod tests;
