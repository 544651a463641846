//! Batched datagram system calls (Linux): `recvmmsg` takes every waiting datagram, up to a
//! batch, in one call, and `sendmmsg` sends a batch in one call, so that a burst of DATA,
//! ACKs and the copies of a unicast fan-out costs one system call rather than one each.

use socket2::SockAddr;
use std::io;
use std::os::fd::RawFd;

/// Takes the datagrams waiting on `fd` without blocking, one into each `slot_bytes` slot of
/// `buffers`; their lengths go into `lengths` (empty if none waited).
pub fn receive(
    fd: RawFd,
    buffers: &mut [u8],
    slot_bytes: usize,
    lengths: &mut Vec<usize>,
) -> io::Result<()> {
    lengths.clear();
    let slots = buffers.len() / slot_bytes;
    assert!(slots > 0, "room for one datagram at least");
    let mut iovecs: Vec<libc::iovec> = buffers
        .chunks_exact_mut(slot_bytes)
        .map(|slot| libc::iovec {
            iov_base: slot.as_mut_ptr().cast(),
            iov_len: slot.len(),
        })
        .collect();
    // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths); each then points
    // at its own iovec below.
    let mut headers: Vec<libc::mmsghdr> =
        (0..slots).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (header, iovec) in headers.iter_mut().zip(iovecs.iter_mut()) {
        header.msg_hdr.msg_iov = iovec;
        header.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `headers` and the iovecs and buffers they point to live for the call, each
    // iovec spans its own slot of `buffers`; the descriptor is open while the caller holds
    // its socket.
    let received = unsafe {
        libc::recvmmsg(
            fd,
            headers.as_mut_ptr(),
            slots as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    for header in &headers[..received as usize] {
        assert!(
            header.msg_len as usize <= slot_bytes,
            "a datagram within its slot"
        );
        lengths.push(header.msg_len as usize);
    }
    Ok(())
}

/// Sends each `(bytes, target)` on `fd`, in calls of at most `batch` datagrams; returns
/// how many the kernel took and how many it refused (a refused one is skipped, the rest
/// still go).
pub fn send(fd: RawFd, datagrams: &[(&[u8], &SockAddr)], batch: usize) -> (u64, u64) {
    let (mut sent, mut refused) = (0, 0);
    for chunk in datagrams.chunks(batch.max(1)) {
        let mut iovecs: Vec<libc::iovec> = chunk
            .iter()
            .map(|(bytes, _)| libc::iovec {
                iov_base: bytes.as_ptr().cast_mut().cast(),
                iov_len: bytes.len(),
            })
            .collect();
        // SAFETY: as in `receive`: all-zero headers, then pointed at live data below.
        let mut headers: Vec<libc::mmsghdr> = (0..chunk.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for ((header, iovec), (_, target)) in headers.iter_mut().zip(iovecs.iter_mut()).zip(chunk) {
            header.msg_hdr.msg_name = target.as_ptr().cast_mut().cast();
            header.msg_hdr.msg_namelen = target.len();
            header.msg_hdr.msg_iov = iovec;
            header.msg_hdr.msg_iovlen = 1;
        }
        let mut at = 0;
        while at < headers.len() {
            let left = &mut headers[at..];
            // SAFETY: the headers, iovecs, bytes and addresses live for the call; the kernel
            // only reads the bytes and addresses (sendmmsg does not write through iov_base).
            let done =
                unsafe { libc::sendmmsg(fd, left.as_mut_ptr(), left.len() as libc::c_uint, 0) };
            if done <= 0 {
                // The first of the rest was refused (a full buffer, a closed port): skip it.
                refused += 1;
                at += 1;
            } else {
                sent += done as u64;
                at += done as usize;
            }
        }
    }
    (sent, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_batch_goes_and_comes_in_one_call_each() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let target = SockAddr::from(receiver.local_addr().unwrap());
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let datagrams: Vec<(&[u8], &SockAddr)> =
            payloads.iter().map(|p| (p.as_slice(), &target)).collect();
        assert_eq!(send(sender.as_raw_fd(), &datagrams, 4), (10, 0));
        let mut buffers = vec![0u8; 16 * 1_000];
        let mut lengths = Vec::new();
        let mut got = Vec::new();
        for _ in 0..100 {
            receive(receiver.as_raw_fd(), &mut buffers, 1_000, &mut lengths)
                .or_else(|e| {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .unwrap();
            for (i, &len) in lengths.iter().enumerate() {
                got.push(buffers[i * 1_000..i * 1_000 + len].to_vec());
            }
            if got.len() == 10 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, payloads);
        let error = receive(receiver.as_raw_fd(), &mut buffers, 1_000, &mut lengths).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        assert!(lengths.is_empty());
    }
}
