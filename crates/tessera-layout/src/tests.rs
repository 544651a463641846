//! Layout tests: CSAR figure 2 placement, and properties over random layouts and writes, run
//! against an in-memory model of the columns that executes the plans' server operations.

use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

#[test]
fn raid5_matches_csar_figure_2() {
    // Three servers: D0, D1 on servers 0 and 1 with P[0-1] on server 2; the next stripe rotates.
    let layout = Layout::new(Scheme::Raid5, 4096, 3).unwrap();
    let columns: Vec<u32> = (0..6).map(|b| layout.data_slot(b).column).collect();
    assert_eq!(columns, vec![0, 1, 2, 0, 1, 2]);
    let parity: Vec<u32> = (0..3)
        .map(|s| layout.parity_slot(s).unwrap().column)
        .collect();
    assert_eq!(parity, vec![2, 1, 0]);
    assert_eq!(layout.parity_slot(3).unwrap().local_index, 1);
}

#[test]
fn raid4_parity_is_fixed_on_last_column() {
    let layout = Layout::new(Scheme::Raid4, 4096, 4).unwrap();
    for stripe in 0..10 {
        assert_eq!(layout.parity_slot(stripe).unwrap().column, 3);
    }
    for block in 0..30 {
        assert!(layout.data_slot(block).column < 3);
    }
}

#[test]
fn bad_layouts_are_refused() {
    assert!(matches!(
        Layout::new(Scheme::Raid5, 65536, 2),
        Err(LayoutError::Width { .. })
    ));
    assert!(Layout::new(Scheme::Raid0, 1000, 3).is_err());
    assert!(Layout::new(Scheme::Raid0, 8 << 20, 3).is_err());
    assert_eq!(
        "raid6".parse::<Scheme>(),
        Err(LayoutError::UnknownScheme("raid6".into()))
    );
    assert_eq!("Hybrid".parse::<Scheme>(), Ok(Scheme::Hybrid));
}

#[test]
fn hybrid_splits_into_leading_full_and_trailing() {
    let layout = Layout::new(Scheme::Hybrid, 4096, 5).unwrap();
    // Stripe = 4 units of 4 KiB. Write from the middle of stripe 0 to the middle of stripe 3.
    let plan = layout.plan_write(8192 + 10, 3 * 16384);
    let methods: Vec<WriteMethod> = plan.stripes.iter().map(|s| s.method).collect();
    assert_eq!(
        methods,
        vec![
            WriteMethod::Overflow,
            WriteMethod::FullStripeParity,
            WriteMethod::FullStripeParity,
            WriteMethod::Overflow
        ]
    );
}

fn scheme_strategy() -> impl Strategy<Value = Scheme> {
    prop::sample::select(Scheme::ALL.to_vec())
}

fn layout_strategy() -> impl Strategy<Value = Layout> {
    (scheme_strategy(), 3u32..9, 0u32..3)
        .prop_map(|(scheme, width, shift)| Layout::new(scheme, 4096 << shift, width).unwrap())
}

proptest! {
    #[test]
    fn split_covers_exactly_the_requested_bytes(
        layout in layout_strategy(), offset in 0u64..200_000, len in 0u64..200_000,
    ) {
        let plan = layout.plan_write(offset, len);
        let mut next = offset;
        for stripe in &plan.stripes {
            for piece in &stripe.extent.pieces {
                let file_offset = piece.block * layout.stripe_unit as u64 + piece.offset_in_unit as u64;
                prop_assert_eq!(file_offset, next, "pieces are contiguous and in order");
                prop_assert_eq!(piece.buf_offset, next - offset);
                prop_assert!(piece.len > 0);
                prop_assert!(piece.offset_in_unit + piece.len <= layout.stripe_unit);
                prop_assert_eq!(layout.stripe_of_block(piece.block), stripe.extent.stripe);
                next += piece.len as u64;
            }
            let stripe_start = stripe.extent.stripe * layout.stripe_bytes();
            let covered: u64 = stripe.extent.pieces.iter().map(|p| p.len as u64).sum();
            prop_assert_eq!(stripe.extent.full, covered == layout.stripe_bytes());
            prop_assert!(stripe.extent.pieces[0].block >= layout.blocks_of_stripe(stripe.extent.stripe).start);
            prop_assert!(stripe_start < offset + len);
        }
        prop_assert_eq!(next, offset + len);
        let stripes: Vec<u64> = plan.stripes.iter().map(|s| s.extent.stripe).collect();
        prop_assert!(stripes.windows(2).all(|w| w[0] < w[1]), "stripes ascend, so locks go lowest first");
    }

    #[test]
    fn every_slot_maps_back_to_its_stripe_and_fits_its_column(
        layout in layout_strategy(), from_start in 0u64..40, from_end in 1u64..40,
    ) {
        let stripes_max = layout.file_bytes_max() / layout.stripe_bytes();
        prop_assert_eq!(layout.file_bytes_max() % layout.stripe_bytes(), 0);
        let unit = u64::from(layout.stripe_unit);
        for stripe in [from_start, stripes_max - from_end] {
            let mut slots: Vec<Slot> = layout.parity_slot(stripe).into_iter().collect();
            for block in layout.blocks_of_stripe(stripe) {
                slots.push(layout.data_slot(block));
                slots.extend(layout.mirror_slot(block));
            }
            for slot in slots {
                prop_assert_eq!(
                    layout.stripe_of_local(slot.column, slot.region, slot.local_index),
                    Some(stripe), "{:?}", slot
                );
                prop_assert!(layout.local_offset(slot) + unit <= COLUMN_BYTES_MAX);
            }
        }
    }

    /// A truncation discards each column's files from `first_local_of_stripe` on: every
    /// member of an earlier stripe lies before that index, every member of the stripe or a
    /// later one at or past it.
    #[test]
    fn a_cut_at_the_first_local_index_of_a_stripe_splits_the_stripes_there(
        layout in layout_strategy(), cut in 0u64..60, stripes in 1u64..12,
    ) {
        for stripe in cut.saturating_sub(stripes)..cut + stripes {
            let mut slots: Vec<Slot> = layout.parity_slot(stripe).into_iter().collect();
            for block in layout.blocks_of_stripe(stripe) {
                slots.push(layout.data_slot(block));
                slots.extend(layout.mirror_slot(block));
            }
            for slot in slots {
                let first = layout.first_local_of_stripe(slot.column, slot.region, cut);
                let first = first.expect("a region holding a member has a first index");
                prop_assert_eq!(slot.local_index >= first, stripe >= cut, "{:?}", slot);
            }
        }
        if layout.scheme == Scheme::Raid0 {
            prop_assert_eq!(layout.first_local_of_stripe(0, Region::Redundancy, cut), None);
        }
    }

    /// Scrub and rebuild find a Hybrid overflow entry's stripe from the column that holds it,
    /// at the primary's local index, widened by one stripe either way: the mirror copy sits on
    /// the next column, under the offsets of the block before.
    #[test]
    fn overflow_entries_map_back_to_within_one_stripe_of_their_own(
        width in 3u32..9, shift in 0u32..3, from_start in 0u64..40, from_end in 1u64..40,
    ) {
        let layout = Layout::new(Scheme::Hybrid, 4096 << shift, width).unwrap();
        let stripes_max = layout.file_bytes_max() / layout.stripe_bytes();
        for stripe in [from_start, stripes_max - from_end] {
            for block in layout.blocks_of_stripe(stripe) {
                let local = layout.data_slot(block).local_index;
                for role in [OverflowRole::Primary, OverflowRole::Mirror] {
                    let column = layout.overflow_column(block, role);
                    let found = layout.stripe_of_local(column, Region::Data, local).unwrap();
                    prop_assert!(found.abs_diff(stripe) <= 1, "{role:?}: {found} for {stripe}");
                }
            }
        }
    }

    #[test]
    fn every_slot_is_used_once_and_one_column_holds_one_member_per_stripe(
        layout in layout_strategy(), stripes in 1u64..12,
    ) {
        let mut seen = HashSet::new();
        for stripe in 0..stripes {
            let mut columns_with_a_member = 0;
            for column in 0..layout.width {
                let members = layout.members_on_column(stripe, column);
                // A column may hold a block and another block's mirror (RAID-1), but never two
                // units that the same loss would both take away.
                let data_blocks: Vec<u64> = members.iter().filter_map(|m| match m {
                    StripeMember::Data { block } => Some(*block), _ => None }).collect();
                prop_assert!(data_blocks.len() <= 1);
                for m in &members {
                    if let StripeMember::Mirror { block } = m {
                        prop_assert!(!data_blocks.contains(block));
                    }
                }
                columns_with_a_member += usize::from(!members.is_empty());
            }
            if layout.scheme != Scheme::Raid4 {
                prop_assert_eq!(columns_with_a_member, layout.width as usize);
            }
            for block in layout.blocks_of_stripe(stripe) {
                prop_assert!(seen.insert(layout.data_slot(block)));
                if let Some(m) = layout.mirror_slot(block) { prop_assert!(seen.insert(m)); }
            }
            if let Some(p) = layout.parity_slot(stripe) { prop_assert!(seen.insert(p)); }
        }
    }

    #[test]
    fn any_one_lost_column_is_reconstructible(
        layout in layout_strategy(),
        writes in prop::collection::vec((0u64..120_000, 1u64..70_000, any::<u8>()), 1..6),
    ) {
        let mut model = ModelCluster::new(layout);
        let mut expected: Vec<u8> = Vec::new();
        for (offset, len, seed) in writes {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            model.write(offset, &data);
            let end = (offset + len) as usize;
            if expected.len() < end { expected.resize(end, 0); }
            expected[offset as usize..end].copy_from_slice(&data);
        }
        prop_assert_eq!(&model.read(expected.len() as u64, None), &expected);
        if layout.scheme.is_redundant() {
            for lost in 0..layout.width {
                prop_assert_eq!(&model.read(expected.len() as u64, Some(lost)), &expected, "lost column {}", lost);
            }
        }
    }
}

/// What one column stores, as plain maps: just enough to run plans and check reconstruction.
#[derive(Default)]
struct ModelColumn {
    data: HashMap<u64, Vec<u8>>,
    redundancy: HashMap<u64, Vec<u8>>,
    overflow: Vec<(OverflowRole, Piece, Vec<u8>)>,
}

struct ModelCluster {
    layout: Layout,
    columns: Vec<ModelColumn>,
}

impl ModelCluster {
    fn new(layout: Layout) -> Self {
        ModelCluster {
            layout,
            columns: (0..layout.width).map(|_| ModelColumn::default()).collect(),
        }
    }

    fn unit(&self) -> usize {
        self.layout.stripe_unit as usize
    }

    fn base(&self, slot: Slot) -> Vec<u8> {
        let column = &self.columns[slot.column as usize];
        let map = match slot.region {
            Region::Data => &column.data,
            Region::Redundancy => &column.redundancy,
        };
        map.get(&slot.local_index)
            .cloned()
            .unwrap_or_else(|| vec![0; self.unit()])
    }

    fn put(&mut self, slot: Slot, range: Range<usize>, bytes: &[u8]) {
        let unit = self.unit();
        let column = &mut self.columns[slot.column as usize];
        let map = match slot.region {
            Region::Data => &mut column.data,
            Region::Redundancy => &mut column.redundancy,
        };
        map.entry(slot.local_index).or_insert_with(|| vec![0; unit])[range].copy_from_slice(bytes);
    }

    fn overlay(&self, column: u32, role: OverflowRole, block: u64, unit: &mut [u8]) {
        for (r, piece, bytes) in &self.columns[column as usize].overflow {
            if *r == role && piece.block == block {
                unit[piece.unit_range()].copy_from_slice(bytes);
            }
        }
    }

    /// Run the plan stripe by stripe through `server_ops`, as a client would.
    fn write(&mut self, offset: u64, data: &[u8]) {
        let plan = self.layout.plan_write(offset, data.len() as u64);
        for stripe_write in plan.stripes.clone() {
            let stripe = stripe_write.extent.stripe;
            let one = WritePlan {
                offset,
                len: data.len() as u64,
                stripes: vec![stripe_write.clone()],
            };
            let ops = self.layout.server_ops(&one);
            // Reads first (read-modify-write), then writes.
            let mut parity = self.layout.parity_slot(stripe).map(|slot| self.base(slot));
            if stripe_write.method == WriteMethod::ReadModifyWrite {
                let parity = parity.as_mut().unwrap();
                for op in ops.iter().flatten() {
                    if let ServerOp::ReadOld { piece } = op {
                        let old = self.base(self.layout.data_slot(piece.block));
                        for (i, p) in piece.unit_range().enumerate() {
                            parity[p] ^= old[p] ^ data[piece.buf_offset as usize + i];
                        }
                    }
                }
            }
            if stripe_write.method == WriteMethod::FullStripeParity {
                let parity = parity.as_mut().unwrap();
                parity.iter_mut().for_each(|b| *b = 0);
                for piece in &stripe_write.extent.pieces {
                    for (i, p) in piece.unit_range().enumerate() {
                        parity[p] ^= data[piece.buf_offset as usize + i];
                    }
                }
            }
            for (column, column_ops) in ops.iter().enumerate() {
                for op in column_ops {
                    match op {
                        ServerOp::Write { slot, piece } => {
                            assert_eq!(slot.column as usize, column);
                            self.put(*slot, piece.unit_range(), &data[piece.buf_range()]);
                        }
                        ServerOp::WriteParity { stripe } => {
                            let slot = self.layout.parity_slot(*stripe).unwrap();
                            let unit = self.unit();
                            self.put(slot, 0..unit, parity.as_ref().unwrap());
                        }
                        ServerOp::WriteOverflow { role, piece } => {
                            self.columns[column].overflow.push((
                                *role,
                                *piece,
                                data[piece.buf_range()].to_vec(),
                            ));
                        }
                        ServerOp::InvalidateOverflow { role, blocks } => {
                            self.columns[column]
                                .overflow
                                .retain(|(r, p, _)| !(r == role && blocks.contains(&p.block)));
                        }
                        ServerOp::LockReadParity { .. } | ServerOp::ReadOld { .. } => {}
                    }
                }
            }
        }
    }

    /// Read the whole file, treating column `lost` as gone.
    fn read(&self, size: u64, lost: Option<u32>) -> Vec<u8> {
        let unit = self.unit() as u64;
        let blocks = size.div_ceil(unit);
        let mut out = Vec::with_capacity((blocks * unit) as usize);
        for block in 0..blocks {
            let slot = self.layout.data_slot(block);
            let mut bytes = if Some(slot.column) != lost {
                let mut b = self.base(slot);
                if self.layout.scheme == Scheme::Hybrid {
                    self.overlay(slot.column, OverflowRole::Primary, block, &mut b);
                }
                b
            } else if let Some(mirror) = self.layout.mirror_slot(block) {
                self.base(mirror)
            } else {
                let stripe = self.layout.stripe_of_block(block);
                let mut b = self.base(self.layout.parity_slot(stripe).unwrap());
                for other in self.layout.blocks_of_stripe(stripe).filter(|&o| o != block) {
                    let o = self.base(self.layout.data_slot(other));
                    b.iter_mut().zip(o).for_each(|(x, y)| *x ^= y);
                }
                if self.layout.scheme == Scheme::Hybrid {
                    let mirror = self.layout.overflow_column(block, OverflowRole::Mirror);
                    self.overlay(mirror, OverflowRole::Mirror, block, &mut b);
                }
                b
            };
            out.append(&mut bytes);
        }
        out.truncate(size as usize);
        out
    }
}
