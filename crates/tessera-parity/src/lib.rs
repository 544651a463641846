//! XOR parity kernel for RAID-4, RAID-5 and Hybrid stripes.
//!
//! This crate owns the byte arithmetic of single parity: computing the parity unit of a stripe
//! from its data units ([`parity_of`]), rebuilding one lost stripe unit from the survivors and
//! the parity ([`reconstruct`]), and the read-modify-write update of a parity unit when one data
//! unit changes ([`update_parity`]). All of them rest on one kernel, [`xor_into`].
//!
//! It is pure: it never does I/O, never allocates, holds no state and uses no `unsafe`. Which
//! units belong to a stripe and where they live is `tessera-layout`'s business; moving the
//! bytes is the storage server's and the client's.
//!
//! Every function asserts that all of its buffers have the same length: a stripe's units are
//! all one stripe unit long, and a mismatch is a bug in the caller, never a condition to
//! recover from.
//!
//! ```
//! use tessera_parity::{parity_of, reconstruct, update_parity};
//!
//! let units: [&[u8]; 3] = [b"stripe u", b"nit zero", b"and more"];
//! let mut parity = [0u8; 8];
//! parity_of(&units, &mut parity);
//!
//! // Lose the middle unit and rebuild it from the survivors and the parity.
//! let mut lost = [0u8; 8];
//! reconstruct(&[units[0], units[2]], &parity, &mut lost);
//! assert_eq!(&lost, b"nit zero");
//!
//! // Overwrite the last unit and patch the parity without reading the others.
//! update_parity(&mut parity, units[2], b"new data");
//! let mut fresh = [0u8; 8];
//! parity_of(&[units[0], units[1], b"new data"], &mut fresh);
//! assert_eq!(parity, fresh);
//! ```

/// Bytes the kernels handle per step. Sixty-four bytes as eight `u64` words is one cache line,
/// and LLVM turns the word loop into four 16-byte SSE2 operations on the baseline x86_64 target
/// (two with AVX2 where enabled) without any target-specific code here.
const CHUNK_BYTES: usize = 64;
/// Bytes in one machine word of the kernels.
const WORD_BYTES: usize = 8;
/// Words in one chunk.
const CHUNK_WORDS: usize = CHUNK_BYTES / WORD_BYTES;
/// Bytes of the output that [`parity_of`] and [`reconstruct`] finish before moving on. They
/// fold every unit into one block of the output while it is still in the L1 cache, instead of
/// streaming the whole output through memory once per unit.
const BLOCK_BYTES: usize = 16 << 10;

/// Reads one chunk as words. Native byte order is right: XOR does not care about it, as long
/// as [`store_chunk`] writes back in the same order.
#[inline(always)]
fn load_chunk(bytes: &[u8]) -> [u64; CHUNK_WORDS] {
    let mut words = [0u64; CHUNK_WORDS];
    for (word, bytes) in words.iter_mut().zip(bytes.chunks_exact(WORD_BYTES)) {
        *word = u64::from_ne_bytes(bytes.try_into().expect("word is WORD_BYTES long"));
    }
    words
}

/// Writes one chunk of words back as bytes, in the order [`load_chunk`] read them.
#[inline(always)]
fn store_chunk(bytes: &mut [u8], words: &[u64; CHUNK_WORDS]) {
    for (bytes, word) in bytes.chunks_exact_mut(WORD_BYTES).zip(words) {
        bytes.copy_from_slice(&word.to_ne_bytes());
    }
}

/// XORs `src` into `dst`: `dst[i] ^= src[i]` for every byte.
///
/// The bulk goes 64 bytes at a time as `[u64; 8]`, which the compiler vectorises; the last
/// `len % 64` bytes go by words and then by bytes. Slices need no particular alignment.
///
/// # Panics
///
/// If `dst` and `src` differ in length.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "xor_into: buffers differ in length");
    let mut dst_chunks = dst.chunks_exact_mut(CHUNK_BYTES);
    let mut src_chunks = src.chunks_exact(CHUNK_BYTES);
    for (dst_chunk, src_chunk) in (&mut dst_chunks).zip(&mut src_chunks) {
        let mut words = load_chunk(dst_chunk);
        let src_words = load_chunk(src_chunk);
        for (word, src_word) in words.iter_mut().zip(src_words) {
            *word ^= src_word;
        }
        store_chunk(dst_chunk, &words);
    }
    xor_tail(dst_chunks.into_remainder(), src_chunks.remainder());
}

/// XORs two sources into `dst` in one pass: `dst[i] ^= a[i] ^ b[i]`. It saves a full read and
/// write of `dst` over two [`xor_into`] calls.
fn xor2_into(dst: &mut [u8], a: &[u8], b: &[u8]) {
    assert_eq!(dst.len(), a.len(), "xor2_into: buffers differ in length");
    assert_eq!(dst.len(), b.len(), "xor2_into: buffers differ in length");
    let mut dst_chunks = dst.chunks_exact_mut(CHUNK_BYTES);
    let mut a_chunks = a.chunks_exact(CHUNK_BYTES);
    let mut b_chunks = b.chunks_exact(CHUNK_BYTES);
    for ((dst_chunk, a_chunk), b_chunk) in (&mut dst_chunks).zip(&mut a_chunks).zip(&mut b_chunks) {
        let mut words = load_chunk(dst_chunk);
        let a_words = load_chunk(a_chunk);
        let b_words = load_chunk(b_chunk);
        for ((word, a_word), b_word) in words.iter_mut().zip(a_words).zip(b_words) {
            *word ^= a_word ^ b_word;
        }
        store_chunk(dst_chunk, &words);
    }
    let dst_tail = dst_chunks.into_remainder();
    xor_tail(dst_tail, a_chunks.remainder());
    xor_tail(dst_tail, b_chunks.remainder());
}

/// XORs the last `len % 64` bytes: whole words first, then single bytes.
#[inline(always)]
fn xor_tail(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    debug_assert!(dst.len() < CHUNK_BYTES);
    let mut dst_words = dst.chunks_exact_mut(WORD_BYTES);
    let mut src_words = src.chunks_exact(WORD_BYTES);
    for (dst_word, src_word) in (&mut dst_words).zip(&mut src_words) {
        let word = u64::from_ne_bytes((&*dst_word).try_into().expect("word is WORD_BYTES long"))
            ^ u64::from_ne_bytes(src_word.try_into().expect("word is WORD_BYTES long"));
        dst_word.copy_from_slice(&word.to_ne_bytes());
    }
    for (dst_byte, src_byte) in dst_words
        .into_remainder()
        .iter_mut()
        .zip(src_words.remainder())
    {
        *dst_byte ^= src_byte;
    }
}

/// Sets `out` to `first ^ rest[0] ^ rest[1] ^ ...`, one L1-sized block of `out` at a time.
fn fold_into(out: &mut [u8], first: &[u8], rest: &[&[u8]]) {
    assert_eq!(
        first.len(),
        out.len(),
        "unit differs in length from the output"
    );
    for unit in rest {
        assert_eq!(
            unit.len(),
            out.len(),
            "unit differs in length from the output"
        );
    }
    for (block_index, out_block) in out.chunks_mut(BLOCK_BYTES).enumerate() {
        let start = block_index * BLOCK_BYTES;
        let range = start..start + out_block.len();
        out_block.copy_from_slice(&first[range.clone()]);
        let mut pairs = rest.chunks_exact(2);
        for pair in &mut pairs {
            xor2_into(out_block, &pair[0][range.clone()], &pair[1][range.clone()]);
        }
        for unit in pairs.remainder() {
            xor_into(out_block, &unit[range.clone()]);
        }
    }
}

/// Computes the parity of a stripe: `out` becomes the XOR of all `units`.
///
/// With no units `out` is all zeros, the parity of an empty stripe.
///
/// # Panics
///
/// If any unit differs in length from `out`.
pub fn parity_of(units: &[&[u8]], out: &mut [u8]) {
    match units.split_first() {
        Some((first, rest)) => fold_into(out, first, rest),
        None => out.fill(0),
    }
}

/// Rebuilds the one lost unit of a stripe into `out`: the parity XOR every surviving unit.
///
/// `survivors` are all the stripe's data units except the lost one, in any order.
///
/// # Panics
///
/// If `parity` or any survivor differs in length from `out`.
pub fn reconstruct(survivors: &[&[u8]], parity: &[u8], out: &mut [u8]) {
    fold_into(out, parity, survivors);
}

/// Patches `parity` for a read-modify-write of one data unit: `parity ^= old_data ^ new_data`.
///
/// The other data units of the stripe are not needed, which is the point of the method.
///
/// # Panics
///
/// If `old_data` or `new_data` differs in length from `parity`.
pub fn update_parity(parity: &mut [u8], old_data: &[u8], new_data: &[u8]) {
    assert_eq!(
        old_data.len(),
        parity.len(),
        "update_parity: old data differs in length from the parity"
    );
    assert_eq!(
        new_data.len(),
        parity.len(),
        "update_parity: new data differs in length from the parity"
    );
    xor2_into(parity, old_data, new_data);
}

#[cfg(test)]
mod tests;
