//! Arithmetic on lists of stripe ranges, as a server's debt on a file is kept.
//!
//! A list is *normal* when its ranges are non-empty, sorted, disjoint and not touching (two
//! ranges that meet, like `0..4` and `4..8`, are one range `0..8`). Every list the manager stores
//! is normal; both functions here take a normal list and return one.

use tessera_wire::IndexRange;

/// Whether `ranges` is normal: non-empty ranges, sorted, disjoint and not touching.
pub(crate) fn is_normal(ranges: &[IndexRange]) -> bool {
    ranges.iter().all(|range| !range.is_empty())
        && ranges.windows(2).all(|pair| pair[0].end < pair[1].start)
}

/// The union of a normal list and one range, as a normal list.
pub(crate) fn merge(ranges: &[IndexRange], range: IndexRange) -> Vec<IndexRange> {
    debug_assert!(is_normal(ranges));
    if range.is_empty() {
        return ranges.to_vec();
    }
    let mut merged = Vec::with_capacity(ranges.len() + 1);
    let mut added = range;
    let mut placed = false;
    for &existing in ranges {
        if existing.end < added.start {
            merged.push(existing);
        } else if added.end < existing.start {
            if !placed {
                merged.push(added);
                placed = true;
            }
            merged.push(existing);
        } else {
            // Overlapping or touching: absorb the existing range into the added one.
            added = IndexRange::new(added.start.min(existing.start), added.end.max(existing.end));
        }
    }
    if !placed {
        merged.push(added);
    }
    debug_assert!(is_normal(&merged));
    merged
}

/// A normal list with one range taken out, as a normal list (ranges are split as needed).
pub(crate) fn subtract(ranges: &[IndexRange], range: IndexRange) -> Vec<IndexRange> {
    debug_assert!(is_normal(ranges));
    if range.is_empty() {
        return ranges.to_vec();
    }
    let mut remaining = Vec::with_capacity(ranges.len() + 1);
    for &existing in ranges {
        if existing.end <= range.start || range.end <= existing.start {
            remaining.push(existing);
            continue;
        }
        if existing.start < range.start {
            remaining.push(IndexRange::new(existing.start, range.start));
        }
        if range.end < existing.end {
            remaining.push(IndexRange::new(range.end, existing.end));
        }
    }
    debug_assert!(is_normal(&remaining));
    remaining
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const INDEX_MAX: u64 = 64;

    fn range_strategy() -> impl Strategy<Value = IndexRange> {
        (0..INDEX_MAX, 0..INDEX_MAX).prop_map(|(start, end)| IndexRange::new(start, end))
    }

    /// The indices a range covers, in the set model.
    fn indices(range: IndexRange) -> impl Iterator<Item = u64> {
        range.start..range.end.max(range.start)
    }

    fn model_of(ranges: &[IndexRange]) -> BTreeSet<u64> {
        ranges.iter().flat_map(|&range| indices(range)).collect()
    }

    #[test]
    fn touching_ranges_merge_into_one() {
        let ranges = merge(&[IndexRange::new(0, 4)], IndexRange::new(8, 12));
        let ranges = merge(&ranges, IndexRange::new(4, 8));
        assert_eq!(ranges, vec![IndexRange::new(0, 12)]);
    }

    #[test]
    fn subtract_splits_a_whole_file_debt() {
        let whole = vec![IndexRange::new(0, u64::MAX)];
        assert_eq!(
            subtract(&whole, IndexRange::new(5, 10)),
            vec![IndexRange::new(0, 5), IndexRange::new(10, u64::MAX)]
        );
        assert_eq!(subtract(&whole, IndexRange::new(0, u64::MAX)), vec![]);
        assert_eq!(merge(&whole, IndexRange::new(3, 9)), whole);
    }

    #[test]
    fn empty_ranges_change_nothing() {
        let ranges = vec![IndexRange::new(2, 6)];
        assert_eq!(merge(&ranges, IndexRange::new(9, 3)), ranges);
        assert_eq!(subtract(&ranges, IndexRange::new(5, 3)), ranges);
        assert_eq!(subtract(&ranges, IndexRange::new(4, 4)), ranges);
    }

    proptest! {
        #[test]
        fn merge_then_subtract_is_set_difference(
            added in prop::collection::vec(range_strategy(), 0..8),
            taken in prop::collection::vec(range_strategy(), 0..8),
        ) {
            let mut ranges = Vec::new();
            let mut model = BTreeSet::new();
            for &range in &added {
                ranges = merge(&ranges, range);
                model.extend(indices(range));
                prop_assert!(is_normal(&ranges));
                prop_assert_eq!(&model_of(&ranges), &model);
            }
            for &range in &taken {
                ranges = subtract(&ranges, range);
                for index in indices(range) {
                    model.remove(&index);
                }
                prop_assert!(is_normal(&ranges));
                prop_assert_eq!(&model_of(&ranges), &model);
            }
        }

        #[test]
        fn interleaved_merges_and_subtractions_follow_the_set_model(
            operations in prop::collection::vec((any::<bool>(), range_strategy()), 0..24),
        ) {
            let mut ranges = Vec::new();
            let mut model = BTreeSet::new();
            for &(add, range) in &operations {
                if add {
                    ranges = merge(&ranges, range);
                    model.extend(indices(range));
                } else {
                    ranges = subtract(&ranges, range);
                    for index in indices(range) {
                        model.remove(&index);
                    }
                }
                prop_assert!(is_normal(&ranges));
                prop_assert_eq!(&model_of(&ranges), &model);
            }
        }
    }
}
