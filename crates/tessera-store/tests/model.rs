//! The store against a model of what each byte should read as: random writes, overflow
//! writes, invalidations, discards (a truncation's) and reopens, then every view compared
//! over the whole range.

use proptest::prelude::*;
use tessera_store::{OverflowRole, Region, Store, BLOCK_BYTES};

const FILE: u64 = 3;
/// Bytes of the address space exercised: a few blocks, so operations collide often.
const SPAN_BYTES: u64 = 6 * BLOCK_BYTES;
const WRITE_BYTES_MAX: u64 = 2 * BLOCK_BYTES + 100;

#[derive(Clone, Debug)]
enum Op {
    Write {
        region: Region,
        offset: u64,
        len: u64,
        fill: u8,
        invalidate_overflow: bool,
    },
    OverflowWrite {
        role: OverflowRole,
        offset: u64,
        len: u64,
        fill: u8,
    },
    Invalidate {
        role: OverflowRole,
        offset: u64,
        len: u64,
    },
    /// Everything of `region` from block `block` on, and of the data file its primary
    /// overflow entries from there.
    Discard {
        region: Region,
        block: u64,
    },
    Reopen,
}

fn role() -> impl Strategy<Value = OverflowRole> {
    prop_oneof![3 => Just(OverflowRole::Primary), 1 => Just(OverflowRole::Mirror)]
}

/// `(offset, len)` inside the span, often block-aligned at one end or both.
fn range(len_max: u64) -> impl Strategy<Value = (u64, u64)> {
    let edge = prop_oneof![
        2 => 0..SPAN_BYTES,
        1 => (0..SPAN_BYTES / BLOCK_BYTES).prop_map(|block| block * BLOCK_BYTES),
    ];
    (edge, 1..=len_max).prop_map(|(offset, len)| (offset, len.min(SPAN_BYTES - offset).max(1)))
}

fn op() -> impl Strategy<Value = Op> {
    let region = || prop_oneof![3 => Just(Region::Data), 1 => Just(Region::Redundancy)];
    prop_oneof![
        4 => (region(), range(WRITE_BYTES_MAX), any::<u8>(), any::<bool>()).prop_map(
            |(region, (offset, len), fill, invalidate)| Op::Write {
                region,
                offset,
                len,
                fill,
                invalidate_overflow: invalidate && region == Region::Data,
            }
        ),
        4 => (role(), range(WRITE_BYTES_MAX), any::<u8>()).prop_map(
            |(role, (offset, len), fill)| Op::OverflowWrite { role, offset, len, fill }
        ),
        2 => (role(), range(SPAN_BYTES)).prop_map(|(role, (offset, len))| Op::Invalidate {
            role,
            offset,
            len
        }),
        1 => (region(), 0..=SPAN_BYTES / BLOCK_BYTES).prop_map(|(region, block)| Op::Discard {
            region,
            block
        }),
        1 => Just(Op::Reopen),
    ]
}

/// Per byte: the data file, the redundancy file, and the live overflow byte of each role.
struct Model {
    data: Vec<u8>,
    redundancy: Vec<u8>,
    primary: Vec<Option<u8>>,
    mirror: Vec<Option<u8>>,
    blocks_written: [Vec<bool>; 2],
}

impl Model {
    fn new() -> Self {
        let bytes = SPAN_BYTES as usize;
        let blocks = (SPAN_BYTES / BLOCK_BYTES) as usize;
        Model {
            data: vec![0; bytes],
            redundancy: vec![0; bytes],
            primary: vec![None; bytes],
            mirror: vec![None; bytes],
            blocks_written: [vec![false; blocks], vec![false; blocks]],
        }
    }

    fn overflow(&mut self, role: OverflowRole) -> &mut Vec<Option<u8>> {
        match role {
            OverflowRole::Primary => &mut self.primary,
            OverflowRole::Mirror => &mut self.mirror,
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write {
                region,
                offset,
                len,
                fill,
                invalidate_overflow,
            } => {
                let range = offset as usize..(offset + len) as usize;
                let (bytes, blocks) = match region {
                    Region::Data => (&mut self.data, &mut self.blocks_written[0]),
                    Region::Redundancy => (&mut self.redundancy, &mut self.blocks_written[1]),
                };
                bytes[range.clone()].fill(fill);
                let first = (offset / BLOCK_BYTES) as usize;
                let end = (offset + len).div_ceil(BLOCK_BYTES) as usize;
                blocks[first..end].fill(true);
                if invalidate_overflow {
                    self.primary[range].fill(None);
                }
            }
            Op::OverflowWrite {
                role,
                offset,
                len,
                fill,
            } => {
                self.overflow(role)[offset as usize..(offset + len) as usize].fill(Some(fill));
            }
            Op::Invalidate { role, offset, len } => {
                self.overflow(role)[offset as usize..(offset + len) as usize].fill(None);
            }
            Op::Discard { region, block } => {
                let from = (block * BLOCK_BYTES) as usize;
                let (bytes, blocks) = match region {
                    Region::Data => (&mut self.data, &mut self.blocks_written[0]),
                    Region::Redundancy => (&mut self.redundancy, &mut self.blocks_written[1]),
                };
                bytes[from..].fill(0);
                blocks[block as usize..].fill(false);
                if region == Region::Data {
                    self.primary[from..].fill(None);
                }
            }
            Op::Reopen => {}
        }
    }

    fn overlay(&self) -> Vec<u8> {
        self.data
            .iter()
            .zip(&self.primary)
            .map(|(&data, &overflow)| overflow.unwrap_or(data))
            .collect()
    }

    fn usage(&self) -> u64 {
        let blocks = self.blocks_written.iter().flatten().filter(|&&w| w).count() as u64;
        let overflow = self.primary.iter().chain(&self.mirror).flatten().count() as u64;
        blocks * BLOCK_BYTES + overflow
    }
}

/// What a listing of the whole span says each byte is, applying entries oldest first.
fn listed(store: &Store, role: OverflowRole) -> Vec<Option<u8>> {
    let (extents, bytes) = store.overflow_list(FILE, role, 0, SPAN_BYTES).unwrap();
    let mut view = vec![None; SPAN_BYTES as usize];
    let mut at = 0usize;
    for extent in extents {
        let len = extent.len as usize;
        assert!(len > 0 && extent.offset + extent.len as u64 <= SPAN_BYTES);
        for (index, &byte) in bytes[at..at + len].iter().enumerate() {
            let slot = &mut view[extent.offset as usize + index];
            assert!(slot.is_none(), "live entries of one role overlap");
            *slot = Some(byte);
        }
        at += len;
    }
    assert_eq!(at, bytes.len());
    view
}

fn check(store: &Store, model: &Model) {
    let span = SPAN_BYTES as u32;
    assert_eq!(
        store.read(FILE, Region::Data, 0, span, true).unwrap(),
        model.overlay()
    );
    assert_eq!(
        store.read(FILE, Region::Data, 0, span, false).unwrap(),
        model.data
    );
    assert_eq!(
        store
            .read(FILE, Region::Redundancy, 0, span, false)
            .unwrap(),
        model.redundancy
    );
    assert_eq!(listed(store, OverflowRole::Primary), model.primary);
    assert_eq!(listed(store, OverflowRole::Mirror), model.mirror);
    assert_eq!(store.usage(FILE).unwrap(), model.usage());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn store_matches_the_byte_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let mut model = Model::new();
        for op in &ops {
            match *op {
                Op::Write { region, offset, len, fill, invalidate_overflow } => {
                    let data = vec![fill; len as usize];
                    store.write(FILE, region, offset, &data, invalidate_overflow).unwrap();
                }
                Op::OverflowWrite { role, offset, len, fill } => {
                    store.overflow_write(FILE, role, offset, &vec![fill; len as usize]).unwrap();
                }
                Op::Invalidate { role, offset, len } => {
                    store.overflow_invalidate(FILE, role, offset, len).unwrap();
                }
                Op::Discard { region, block } => {
                    store.discard(FILE, region, block * BLOCK_BYTES).unwrap();
                }
                Op::Reopen => {
                    drop(store);
                    store = Store::open(dir.path()).unwrap();
                }
            }
            model.apply(op);
            // A small read at a random-ish place after every step, overlay on.
            let probe = (ops.len() as u64 * 977) % SPAN_BYTES;
            let len = (SPAN_BYTES - probe).min(300);
            let got = store.read(FILE, Region::Data, probe, len as u32, true).unwrap();
            prop_assert_eq!(&got[..], &model.overlay()[probe as usize..(probe + len) as usize]);
        }
        check(&store, &model);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        check(&store, &model);
    }
}
