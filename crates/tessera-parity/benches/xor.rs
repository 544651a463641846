//! Throughput of the XOR kernel beside `memcpy` on the same buffers, and of a stripe's parity.
//!
//! `memcpy` (`copy_from_slice`) is the yardstick: it reads one buffer and writes one, where
//! `xor_into` reads two and writes one, so about half to all of memcpy's rate is the goal.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tessera_parity::{parity_of, xor_into};

/// Buffer sizes: one default stripe unit (64 KiB, cache resident) and the 1 MiB stripe unit.
const BUFFER_BYTES: [usize; 2] = [64 << 10, 1 << 20];
/// Data units in the parity benchmark's stripe.
const PARITY_UNIT_COUNT: usize = 4;
/// Length of each unit in the parity benchmark.
const PARITY_UNIT_BYTES: usize = 64 << 10;

/// Deterministic filler, so the buffers are not all zeros and runs are comparable.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn xor_vs_memcpy(c: &mut Criterion) {
    let mut group = c.benchmark_group("xor_vs_memcpy");
    for len in BUFFER_BYTES {
        let src = pattern(len, 7);
        let mut dst = pattern(len, 91);
        group.throughput(Throughput::Bytes(len as u64));
        let label = format!("{}KiB", len >> 10);
        group.bench_with_input(BenchmarkId::new("xor_into", &label), &src, |b, src| {
            b.iter(|| xor_into(black_box(&mut dst), black_box(src)))
        });
        group.bench_with_input(BenchmarkId::new("memcpy", &label), &src, |b, src| {
            b.iter(|| black_box(&mut dst[..]).copy_from_slice(black_box(src)))
        });
    }
    group.finish();
}

fn parity_of_stripe(c: &mut Criterion) {
    let units: Vec<Vec<u8>> = (0..PARITY_UNIT_COUNT)
        .map(|index| pattern(PARITY_UNIT_BYTES, index as u8))
        .collect();
    let unit_slices: Vec<&[u8]> = units.iter().map(Vec::as_slice).collect();
    let mut parity = vec![0u8; PARITY_UNIT_BYTES];
    let mut group = c.benchmark_group("parity_of");
    // Count the data read: every unit is consumed once.
    group.throughput(Throughput::Bytes(
        (PARITY_UNIT_COUNT * PARITY_UNIT_BYTES) as u64,
    ));
    group.bench_function(
        format!("{PARITY_UNIT_COUNT}x{}KiB", PARITY_UNIT_BYTES >> 10),
        |b| b.iter(|| parity_of(black_box(&unit_slices), black_box(&mut parity))),
    );
    group.finish();
}

criterion_group!(benches, xor_vs_memcpy, parity_of_stripe);
criterion_main!(benches);
