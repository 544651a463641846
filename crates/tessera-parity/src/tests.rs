//! Parity tests: the kernel against a naive byte loop, and the stripe identities (parity then
//! reconstruction, read-modify-write against recomputation) over random stripes.

use super::*;
use proptest::prelude::*;

/// Largest misalignment applied to a slice's start, to exercise unaligned heads.
const OFFSET_BYTES_MAX: usize = 7;

/// The specification of [`xor_into`]: one byte at a time.
fn xor_naive(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// The specification of [`parity_of`]: XOR of all units, byte by byte.
fn parity_naive(units: &[Vec<u8>], len: usize) -> Vec<u8> {
    let mut parity = vec![0u8; len];
    for unit in units {
        xor_naive(&mut parity, unit);
    }
    parity
}

/// Two buffers of `len + OFFSET_BYTES_MAX` random bytes, and an offset into each.
fn misaligned_pair(
    len_max: usize,
) -> impl Strategy<Value = (Vec<u8>, Vec<u8>, usize, usize, usize)> {
    (0..len_max).prop_flat_map(|len| {
        let buffer = prop::collection::vec(any::<u8>(), len + OFFSET_BYTES_MAX);
        (
            buffer.clone(),
            buffer,
            0..=OFFSET_BYTES_MAX,
            0..=OFFSET_BYTES_MAX,
            Just(len),
        )
    })
}

/// A stripe of `1..=width_max` data units, all `len` bytes long for a `len` below `len_max`,
/// and the index of one unit to lose.
fn stripe(width_max: usize, len_max: usize) -> impl Strategy<Value = (Vec<Vec<u8>>, usize)> {
    (1..=width_max, 0..len_max).prop_flat_map(|(width, len)| {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), len), width),
            0..width,
        )
    })
}

fn as_slices(units: &[Vec<u8>]) -> Vec<&[u8]> {
    units.iter().map(Vec::as_slice).collect()
}

/// Computes the parity of `units` and checks that each of them, once lost, is rebuilt exactly.
fn check_parity_then_reconstruct(units: &[Vec<u8>], lost_index: usize) {
    let len = units[0].len();
    let mut parity = vec![0xA5u8; len];
    parity_of(&as_slices(units), &mut parity);
    assert_eq!(parity, parity_naive(units, len));

    let survivors: Vec<&[u8]> = units
        .iter()
        .enumerate()
        .filter(|&(index, _)| index != lost_index)
        .map(|(_, unit)| unit.as_slice())
        .collect();
    let mut rebuilt = vec![0x5Au8; len];
    reconstruct(&survivors, &parity, &mut rebuilt);
    assert_eq!(rebuilt, units[lost_index]);
}

proptest! {
    #[test]
    fn xor_into_matches_naive_byte_loop_on_misaligned_slices(
        (mut dst, src, dst_offset, src_offset, len) in misaligned_pair(5000)
    ) {
        let mut expected = dst.clone();
        xor_naive(
            &mut expected[dst_offset..dst_offset + len],
            &src[src_offset..src_offset + len],
        );
        xor_into(&mut dst[dst_offset..dst_offset + len], &src[src_offset..src_offset + len]);
        prop_assert_eq!(dst, expected);
    }

    #[test]
    fn xor_into_twice_is_identity(
        (mut dst, src, dst_offset, src_offset, len) in misaligned_pair(5000)
    ) {
        let original = dst.clone();
        let src = &src[src_offset..src_offset + len];
        xor_into(&mut dst[dst_offset..dst_offset + len], src);
        xor_into(&mut dst[dst_offset..dst_offset + len], src);
        prop_assert_eq!(dst, original);
    }

    #[test]
    fn parity_then_reconstruct_recovers_any_lost_unit((units, lost_index) in stripe(9, 5000)) {
        check_parity_then_reconstruct(&units, lost_index);
    }

    #[test]
    fn update_parity_equals_recomputed_parity(
        ((mut units, changed_index), new_data_seed) in (stripe(9, 5000), any::<u64>())
    ) {
        let len = units[0].len();
        let mut parity = vec![0u8; len];
        parity_of(&as_slices(&units), &mut parity);

        // Derive the new data from a seed so it has the unit's length whatever that is.
        let new_data: Vec<u8> = (0..len)
            .map(|index| (new_data_seed.rotate_left(index as u32 % 64) as u8) ^ index as u8)
            .collect();
        update_parity(&mut parity, &units[changed_index], &new_data);
        units[changed_index] = new_data;

        let mut recomputed = vec![0u8; len];
        parity_of(&as_slices(&units), &mut recomputed);
        prop_assert_eq!(parity, recomputed);
    }
}

proptest! {
    // Units longer than one block of the output, so the blocked fold crosses block boundaries
    // and ends on a partial block. Fewer cases: each one is several blocks wide.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn parity_then_reconstruct_recovers_any_lost_unit_across_blocks(
        (units, lost_index) in (1usize..=6, BLOCK_BYTES - 100..3 * BLOCK_BYTES + 100)
            .prop_flat_map(|(width, len)| {
                (
                    prop::collection::vec(prop::collection::vec(any::<u8>(), len), width),
                    0..width,
                )
            })
    ) {
        check_parity_then_reconstruct(&units, lost_index);
    }
}

#[test]
fn parity_of_no_units_is_zeros() {
    let mut parity = vec![0xFFu8; 100];
    parity_of(&[], &mut parity);
    assert!(parity.iter().all(|&byte| byte == 0));
}

#[test]
fn parity_of_one_unit_is_the_unit() {
    let unit: Vec<u8> = (0..=255).collect();
    let mut parity = vec![0u8; unit.len()];
    parity_of(&[&unit], &mut parity);
    assert_eq!(parity, unit);
}

#[test]
fn reconstruct_with_no_survivors_is_the_parity() {
    // A stripe of one data unit: its parity is a mirror of it.
    let parity: Vec<u8> = (0..200).map(|index| index as u8).collect();
    let mut rebuilt = vec![0u8; parity.len()];
    reconstruct(&[], &parity, &mut rebuilt);
    assert_eq!(rebuilt, parity);
}

#[test]
fn empty_buffers_are_accepted() {
    let mut empty: [u8; 0] = [];
    xor_into(&mut empty, &[]);
    parity_of(&[&[], &[]], &mut empty);
    reconstruct(&[&[]], &[], &mut empty);
    update_parity(&mut empty, &[], &[]);
}

#[test]
#[should_panic(expected = "differ in length")]
fn xor_into_rejects_length_mismatch() {
    xor_into(&mut [0u8; 8], &[0u8; 9]);
}

#[test]
#[should_panic(expected = "differs in length")]
fn parity_of_rejects_unit_length_mismatch() {
    parity_of(&[&[0u8; 64], &[0u8; 63]], &mut [0u8; 64]);
}

#[test]
#[should_panic(expected = "differs in length")]
fn reconstruct_rejects_parity_length_mismatch() {
    reconstruct(&[&[0u8; 64]], &[0u8; 65], &mut [0u8; 64]);
}

#[test]
#[should_panic(expected = "differs in length")]
fn update_parity_rejects_length_mismatch() {
    update_parity(&mut [0u8; 64], &[0u8; 64], &[0u8; 32]);
}
