//! The disk under the store: every file and directory operation the store does goes through
//! [`Disk`] and [`DiskFile`], so that the same store runs on the real file system
//! ([`RealDisk`], `std::fs` and `libc`) and on an in-memory disk with fault injection
//! ([`crate::MemDisk`]: lost fsyncs, torn writes, flipped bits) in the whole-cluster simulator.
//!
//! The operations are the POSIX ones the store relies on, with their durability rules: bytes
//! written reach the disk only at [`DiskFile::sync_data`] (or [`Disk::sync_fs`]); a created,
//! renamed or removed name only at [`Disk::sync_dir`] of its directory (or [`Disk::sync_fs`]).

use std::any::Any;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// An open file of a [`Disk`].
pub type FileHandle = Arc<dyn DiskFile>;

/// A held exclusive lock on a store's directory ([`Disk::lock`]); released when dropped.
pub type DiskLock = Box<dyn Any + Send + Sync>;

/// What a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
}

/// The capacity of the file system under a path ([`Disk::space`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskSpace {
    /// Its size in bytes.
    pub total: u64,
    /// Bytes an unprivileged writer can still use.
    pub available: u64,
}

/// A file system, as the store uses it. Paths are whole paths (the store's root joined with
/// its names). Errors are [`io::Error`]s with the kinds `std::fs` gives (`NotFound`,
/// `AlreadyExists`, `WouldBlock` for a lock held elsewhere).
pub trait Disk: Send + Sync + fmt::Debug {
    /// Opens `path` for reading and writing, creating it empty if it does not exist (its
    /// directory must), never truncating it.
    fn open(&self, path: &Path) -> io::Result<FileHandle>;
    /// Opens an existing file; `NotFound` if there is none.
    fn open_existing(&self, path: &Path) -> io::Result<FileHandle>;
    /// Creates `path` empty, truncating it if it exists.
    fn create(&self, path: &Path) -> io::Result<FileHandle>;
    /// What `path` is, or `None` if nothing has that name.
    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>>;
    /// Creates a directory; `AlreadyExists` if the name is taken.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Creates a directory and any missing parents; fine if it exists.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything under it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Renames a file over another (atomically replacing it).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// The names in a directory, in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Makes a directory's entries durable (creations, renames and removals in it).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes everything written to the file system holding `path` durable (`syncfs`).
    fn sync_fs(&self, path: &Path) -> io::Result<()>;
    /// This boot of the machine (or power cycle of the disk): it changes whenever what was
    /// only in the page cache may have been lost, and only then (a process restart keeps it).
    fn boot_id(&self) -> u64;
    /// Takes an exclusive lock on `path` (a file, created if missing), held until the returned
    /// guard is dropped; `WouldBlock` if another holder has it.
    fn lock(&self, path: &Path) -> io::Result<DiskLock>;
    /// The size and free space of the file system holding `path` (`statvfs`).
    fn space(&self, path: &Path) -> io::Result<DiskSpace>;
    /// Bytes the file at `path` occupies on disk (allocated blocks, not its length: a
    /// sparse file's holes cost nothing).
    fn allocated(&self, path: &Path) -> io::Result<u64>;
}

/// An open file.
pub trait DiskFile: Send + Sync + fmt::Debug {
    /// Reads at `offset` into `buf`; the count read, 0 at or past the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// [`read_at`](Self::read_at) without waiting for the disk: `WouldBlock` if the bytes
    /// are not in memory.
    fn read_cached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// [`read_at`](Self::read_at), or with `cached` [`read_cached_at`](Self::read_cached_at),
    /// into memory not initialized yet: the count read, the bytes initialized. So that a
    /// read's buffer is not first zeroed only to be overwritten (5% of a server's CPU in a
    /// 1 GiB read). By default the buffer is zeroed and read into.
    fn read_uninit_at(
        &self,
        buf: &mut [MaybeUninit<u8>],
        offset: u64,
        cached: bool,
    ) -> io::Result<usize> {
        for byte in buf.iter_mut() {
            byte.write(0);
        }
        // SAFETY: every byte of `buf` was just initialized, and `u8` has no invalid values.
        let buf = unsafe { &mut *(buf as *mut [MaybeUninit<u8>] as *mut [u8]) };
        match cached {
            false => self.read_at(buf, offset),
            true => self.read_cached_at(buf, offset),
        }
    }
    /// Asks for `offset..offset+len` to be read into memory in the background
    /// (`posix_fadvise(POSIX_FADV_WILLNEED)`), without waiting for it: a hint, which the
    /// page cache keeps coherent with writes like any read.
    fn advise_will_need(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, extending the file if need be.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncates or extends (with a hole) the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Makes the file's bytes and length durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// The first byte at or after `offset` that lies in allocated space (`SEEK_DATA`), or
    /// `None` if there is none before the end.
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>>;
    /// The first byte at or after `offset` that lies in a hole or at the end (`SEEK_HOLE`).
    fn next_hole(&self, offset: u64) -> io::Result<u64>;
}

/// Reads a whole file.
pub(crate) fn read_file(disk: &dyn Disk, path: &Path) -> io::Result<Vec<u8>> {
    let file = disk.open_existing(path)?;
    let len = usize::try_from(file.size()?).map_err(|_| io::Error::from(ErrorKind::OutOfMemory))?;
    let mut bytes = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut bytes[done..], done as u64)? {
            0 => break,
            read => done += read,
        }
    }
    bytes.truncate(done);
    Ok(bytes)
}

/// Writes `bytes` as the whole of a new file at `path` (truncating any old one) and makes them
/// durable; the name itself is durable only once its directory is synced. Returns the file,
/// open.
pub(crate) fn write_file_synced(
    disk: &dyn Disk,
    path: &Path,
    bytes: &[u8],
) -> io::Result<FileHandle> {
    let file = disk.create(path)?;
    file.write_all_at(bytes, 0)?;
    file.sync_data()?;
    Ok(file)
}

/// The real file system: `std::fs` and `libc`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

impl RealDisk {
    /// The real disk as a shared [`Disk`].
    pub fn shared() -> Arc<dyn Disk> {
        Arc::new(RealDisk)
    }
}

fn read_write() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    options
}

impl Disk for RealDisk {
    fn open(&self, path: &Path) -> io::Result<FileHandle> {
        let file = read_write().create(true).truncate(false).open(path)?;
        Ok(Arc::new(RealFile(file)))
    }

    fn open_existing(&self, path: &Path) -> io::Result<FileHandle> {
        Ok(Arc::new(RealFile(read_write().open(path)?)))
    }

    fn create(&self, path: &Path) -> io::Result<FileHandle> {
        let file = read_write().create(true).truncate(true).open(path)?;
        Ok(Arc::new(RealFile(file)))
    }

    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>> {
        match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(Some(EntryKind::Dir)),
            Ok(_) => Ok(Some(EntryKind::File)),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn sync_fs(&self, path: &Path) -> io::Result<()> {
        let handle = File::open(path)?;
        // SAFETY: syncfs only reads the descriptor number, which `handle` keeps open.
        if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`) folded to 64 bits; 0 where
    /// it cannot be read (then a reboot is not noticed: the behaviour before the check).
    fn boot_id(&self) -> u64 {
        let text = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let hex = text.trim().replace('-', "");
        u128::from_str_radix(&hex, 16).map_or(0, |id| (id as u64) ^ ((id >> 64) as u64))
    }

    fn lock(&self, path: &Path) -> io::Result<DiskLock> {
        let file = read_write().create(true).truncate(false).open(path)?;
        // SAFETY: flock only reads the descriptor number, which `file` keeps open for the call.
        let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Box::new(file))
    }

    fn space(&self, path: &Path) -> io::Result<DiskSpace> {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::from(ErrorKind::InvalidInput))?;
        // SAFETY: statvfs writes only into `stat`, a plain struct we own; the path is a
        // NUL-terminated string kept alive for the call.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let fragment = stat.f_frsize as u64;
        Ok(DiskSpace {
            total: (stat.f_blocks as u64).saturating_mul(fragment),
            available: (stat.f_bavail as u64).saturating_mul(fragment),
        })
    }

    fn allocated(&self, path: &Path) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        // st_blocks counts 512-byte units whatever the file system's block size.
        Ok(fs::symlink_metadata(path)?.blocks().saturating_mul(512))
    }
}

/// A file of the real file system.
#[derive(Debug)]
struct RealFile(File);

impl DiskFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    /// One `preadv2(RWF_NOWAIT)` (Linux 4.14): the kernel fails the read rather than start
    /// disk I/O. A file system without it counts as "would block", so the caller takes the
    /// slow path.
    fn read_cached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // SAFETY: the same memory seen as possibly uninitialized, which it is not; the read
        // below writes only bytes into it.
        let buf = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
        self.read_uninit_at(buf, offset, true)
    }

    /// One `preadv2`, with `RWF_NOWAIT` if `cached` (Linux 4.14; a file system without it
    /// counts as "would block"), straight into `buf`: the kernel writes the bytes it reports
    /// read, and nothing here reads `buf`.
    fn read_uninit_at(
        &self,
        buf: &mut [MaybeUninit<u8>],
        offset: u64,
        cached: bool,
    ) -> io::Result<usize> {
        let offset = off_t(offset)?;
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let flags = if cached { libc::RWF_NOWAIT } else { 0 };
        // SAFETY: one iovec over `buf`, valid and writable for its whole length during the
        // call; the kernel only writes it.
        let read = unsafe { libc::preadv2(self.0.as_raw_fd(), &iov, 1, offset, flags) };
        if read >= 0 {
            return Ok(read as usize);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) if cached => {
                Err(ErrorKind::WouldBlock.into())
            }
            _ => Err(error),
        }
    }

    fn advise_will_need(&self, offset: u64, len: u64) -> io::Result<()> {
        let (offset, len) = (off_t(offset)?, off_t(len)?);
        // SAFETY: posix_fadvise only reads the descriptor number, which `self` keeps open.
        let result = unsafe {
            libc::posix_fadvise(self.0.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED)
        };
        match result {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    /// `lseek(SEEK_DATA)`; a file system without it (`EINVAL`) has data everywhere, which is
    /// what the kernel's generic fallback says too.
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        match self.seek(offset, libc::SEEK_DATA) {
            Ok(data) => Ok(Some(data)),
            Err(error) if error.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Ok(Some(offset)),
            Err(error) => Err(error),
        }
    }

    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        match self.seek(offset, libc::SEEK_HOLE) {
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => self.size(),
            result => result,
        }
    }
}

impl RealFile {
    /// One `lseek` with `whence`; the file position it moves is not used by positioned I/O.
    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<u64> {
        // SAFETY: lseek on a file descriptor we own for the duration of the call.
        let found = unsafe { libc::lseek(self.0.as_raw_fd(), off_t(offset)?, whence) };
        if found < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(found as u64)
    }
}

fn off_t(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from(ErrorKind::InvalidInput))
}
