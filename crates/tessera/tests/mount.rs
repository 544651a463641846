//! `tessera mount`: a local cluster mounted through FUSE behaves as a file system to
//! ordinary programs, agrees with the CLI, and keeps every fsync'd byte when the mount
//! process is killed. Needs /dev/fuse and fusermount3 (the CI installs fuse3): without them
//! these tests fail, they do not skip.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Output};

mod command;
use command::{tessera, text};

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A local cluster and a mount of it, both stopped on every way out.
struct Mounted {
    root: tempfile::TempDir,
    cluster: PathBuf,
    mountpoint: PathBuf,
    pid: Option<i32>,
}

impl Mounted {
    fn start() -> Mounted {
        Mounted::start_with(&[])
    }

    /// A local cluster started with these extra `tessera up` arguments, mounted.
    fn start_with(up_args: &[&str]) -> Mounted {
        Mounted::start_mounted_with(up_args, &[])
    }

    /// A local cluster started with extra `tessera up` arguments, mounted with extra
    /// `tessera mount` arguments.
    fn start_mounted_with(up_args: &[&str], mount_args: &[&str]) -> Mounted {
        let root = tempfile::Builder::new()
            .prefix("tessera-mount-")
            .tempdir()
            .expect("temporary directory");
        let dir = root.path().join("cluster");
        let mountpoint = root.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mut up = vec!["up", "--servers", "3", "--dir", text(&dir), "--detach"];
        up.extend_from_slice(up_args);
        ok(tessera(&up));
        let mut mounted = Mounted {
            cluster: dir.join("cluster.toml"),
            root,
            mountpoint,
            pid: None,
        };
        mounted.mount_with(mount_args);
        mounted
    }

    fn mount(&mut self) {
        self.mount_with(&[]);
    }

    /// Mounts with these extra `tessera mount` arguments.
    fn mount_with(&mut self, extra: &[&str]) {
        let mut args = vec![
            "--cluster",
            text(&self.cluster),
            "mount",
            text(&self.mountpoint),
        ];
        args.extend_from_slice(extra);
        let out = ok(tessera(&args));
        let pid = out
            .split("pid ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no pid in '{out}'"));
        self.pid = Some(pid);
    }

    fn umount(&mut self) {
        ok(tessera(&["umount", text(&self.mountpoint)]));
        self.wait_for_exit();
    }

    fn wait_for_exit(&mut self) {
        if let Some(pid) = self.pid.take() {
            for _ in 0..200 {
                // SAFETY: signal 0 only asks whether the process exists.
                if unsafe { libc_kill(pid, 0) } != 0 {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            panic!("mount process {pid} did not end");
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }

    fn cli(&self, args: &[&str]) -> Output {
        let mut all = vec!["--cluster", text(&self.cluster)];
        all.extend_from_slice(args);
        tessera(&all)
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.pid.is_some() {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z", text(&self.mountpoint)])
                .output();
            if let Some(pid) = self.pid.take() {
                // SAFETY: kills only the mount process this test started.
                unsafe { libc_kill(pid, 9) };
            }
        }
        let dir = self.cluster.parent().unwrap().to_path_buf();
        let _ = tessera(&["down", "--dir", text(&dir)]);
    }
}

/// A file system's (total, available) bytes.
fn statvfs(path: &std::path::Path) -> (u64, u64) {
    let c_path = std::ffi::CString::new(text(path)).unwrap();
    // SAFETY: statvfs writes only into `stat`, which we own; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) },
        0,
        "statvfs {path:?}"
    );
    let fragment = stat.f_frsize as u64;
    (
        stat.f_blocks as u64 * fragment,
        stat.f_bavail as u64 * fragment,
    )
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[test]
fn a_mounted_cluster_behaves_like_a_file_system_and_agrees_with_the_cli() {
    let mut m = Mounted::start();
    // A large file through the mount, read back through the mount and through the CLI.
    let big = random_bytes(20 << 20, 7);
    std::fs::write(m.path("big"), &big).unwrap();
    assert_eq!(std::fs::read(m.path("big")).unwrap(), big);
    let fetched = m.root.path().join("fetched");
    ok(m.cli(&["get", "big", text(&fetched)]));
    assert_eq!(
        std::fs::read(&fetched).unwrap(),
        big,
        "the CLI reads what the mount wrote"
    );
    let meta = std::fs::metadata(m.path("big")).unwrap();
    assert_eq!(meta.len(), big.len() as u64);
    // df: the three servers' disks (one file system here, so three times its size), raw.
    let (mounted, local) = (statvfs(&m.mountpoint), statvfs(m.root.path()));
    assert_eq!(
        mounted.0,
        3 * local.0,
        "total bytes: mount vs 3 x the local disk"
    );
    assert!(mounted.1 > 0 && mounted.1 <= mounted.0, "free {mounted:?}");
    let age = std::time::SystemTime::now()
        .duration_since(meta.modified().unwrap())
        .unwrap_or_default();
    assert!(age.as_secs() < 120, "modification time is {age:?} old");

    // Writes at offsets, past the end, and truncation, against a model.
    let mut model = big[..1 << 20].to_vec();
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("edit"))
        .unwrap();
    file.write_all(&model).unwrap();
    for (offset, len, seed) in [
        (1000u64, 70_000usize, 1u64),
        (900_000, 300_000, 2),
        (5, 3, 3),
    ] {
        let bytes = random_bytes(len, seed);
        file.seek(SeekFrom::Start(offset)).unwrap();
        file.write_all(&bytes).unwrap();
        let end = offset as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[offset as usize..end].copy_from_slice(&bytes);
    }
    file.sync_all().unwrap();
    file.set_len(500_000).unwrap();
    model.truncate(500_000);
    file.set_len(600_000).unwrap();
    model.resize(600_000, 0);
    let mut back = Vec::new();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_to_end(&mut back).unwrap();
    assert!(
        back == model,
        "read back differs from the model (truncate must zero)"
    );
    drop(file);

    // Directories and renames.
    std::fs::create_dir_all(m.path("a/b")).unwrap();
    std::fs::write(m.path("a/b/f"), b"inside").unwrap();
    assert_eq!(
        std::fs::remove_dir(m.path("a")).unwrap_err().kind(),
        std::io::ErrorKind::DirectoryNotEmpty
    );
    std::fs::rename(m.path("a"), m.path("c")).unwrap();
    assert_eq!(std::fs::read(m.path("c/b/f")).unwrap(), b"inside");
    assert!(!m.path("a").exists());
    std::fs::write(m.path("other"), b"other").unwrap();
    std::fs::rename(m.path("other"), m.path("c/b/f")).unwrap();
    assert_eq!(std::fs::read(m.path("c/b/f")).unwrap(), b"other");
    let mut names: Vec<String> = std::fs::read_dir(m.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["big", "c", "edit"]);
    assert!(std::fs::metadata(m.path("c")).unwrap().is_dir());
    assert_eq!(std::fs::metadata(m.path("c/b/f")).unwrap().size(), 5);
    std::fs::remove_file(m.path("c/b/f")).unwrap();
    std::fs::remove_dir(m.path("c/b")).unwrap();
    std::fs::remove_dir(m.path("c")).unwrap();
    assert_eq!(
        std::fs::read(m.path("nope")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );

    // An ordinary program, and the CLI's files seen through the mount.
    let copied = Command::new("cp")
        .args([text(&m.path("big")), text(&m.path("copy"))])
        .status()
        .unwrap();
    assert!(copied.success());
    assert_eq!(std::fs::read(m.path("copy")).unwrap(), big);
    ok(m.cli(&["put", text(&fetched), "dir/from-cli"]));
    assert_eq!(std::fs::read(m.path("dir/from-cli")).unwrap(), big);

    // Unmounted and mounted again: everything is still there.
    m.umount();
    assert!(!m.path("big").exists(), "still mounted after umount");
    m.mount();
    assert_eq!(std::fs::read(m.path("edit")).unwrap(), model);
    assert_eq!(std::fs::read(m.path("copy")).unwrap(), big);
    m.umount();
}

/// Directories and renames are ordered manager changes: with three replicas they keep
/// working, and stay, when the leader replica is stopped between two of them.
#[test]
fn the_tree_survives_losing_the_leader_of_three_manager_replicas() {
    let mut m = Mounted::start_with(&["--managers", "3"]);
    std::fs::create_dir_all(m.path("a/b")).unwrap();
    std::fs::write(m.path("a/b/f"), b"one").unwrap();
    std::fs::rename(m.path("a"), m.path("z")).unwrap();
    let dir = m.cluster.parent().unwrap().to_path_buf();
    ok(tessera(&["manager", "stop", "1", "--dir", text(&dir)]));
    std::fs::write(m.path("z/g"), b"two").unwrap();
    std::fs::create_dir(m.path("w")).unwrap();
    std::fs::rename(m.path("z/b"), m.path("w/b2")).unwrap();
    assert_eq!(std::fs::read(m.path("w/b2/f")).unwrap(), b"one");
    assert_eq!(std::fs::read(m.path("z/g")).unwrap(), b"two");
    assert!(!m.path("a").exists() && !m.path("z/b").exists());
    // What the mount did is what the cluster holds, seen from a fresh client.
    let listed = ok(m.cli(&["ls"]));
    for path in ["w/b2/f", "z/g"] {
        assert!(listed.contains(path), "{path} missing from:\n{listed}");
    }
    m.umount();
}

#[test]
fn fsynced_bytes_survive_a_killed_mount_process() {
    let mut m = Mounted::start();
    let synced = random_bytes(3 << 20, 11);
    let mut file = std::fs::File::create(m.path("durable")).unwrap();
    file.write_all(&synced).unwrap();
    file.sync_all().unwrap();
    // Written after the fsync and never flushed: may be lost, must not corrupt the rest.
    file.write_all(&random_bytes(1 << 20, 12)).unwrap();
    let pid = m.pid.take().unwrap();
    // SAFETY: kills only the mount process this test started.
    unsafe { libc_kill(pid, 9) };
    drop(file);
    let _ = Command::new("fusermount3")
        .args(["-u", "-z", text(&m.mountpoint)])
        .output();
    let fetched = m.root.path().join("fetched");
    ok(m.cli(&["get", "durable", text(&fetched)]));
    let got = std::fs::read(&fetched).unwrap();
    assert!(
        got.len() >= synced.len(),
        "fsync'd bytes lost: {} left",
        got.len()
    );
    assert!(got[..synced.len()] == synced[..], "fsync'd bytes changed");
}

/// Offsets at the limits: a write past the file's largest size (a RAID-5 file of 64 KiB units
/// over 3 servers holds 2 TiB) is refused by `write` itself with `EFBIG` (not later, at the
/// `fsync` or `close` that sends it), one at the kernel's own limit by `write` or at the
/// latest by `fsync`, and neither changes anything: the file keeps its size
/// and bytes, and the mount goes on serving.
#[test]
fn writes_at_offsets_near_the_limits_fail_and_change_nothing() {
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::start_mounted_with(&[], &["--scheme", "raid5"]);
    std::fs::write(m.path("f"), b"hello").unwrap();
    // Offsets from 2^63 - 1 on are past the kernel's own limit: it refuses them itself.
    let ours = |offset: u64| offset < (1u64 << 63) - 1;
    for offset in [1u64 << 50, 1u64 << 62, (1u64 << 63) - 1, u64::MAX - 1] {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path("f"))
            .unwrap();
        let refused = match file.write_at(b"x", offset) {
            Err(e) => Some(e),
            Ok(_) if ours(offset) => panic!("a write at {offset} was taken"),
            Ok(_) => file.sync_all().err(),
        };
        let error = refused.unwrap_or_else(|| panic!("a write at {offset} was made durable"));
        let code = error.raw_os_error();
        assert!(
            !ours(offset) || code == Some(libc::EFBIG),
            "at {offset}: {error}"
        );
        assert!(
            matches!(
                code,
                Some(libc::EFBIG) | Some(libc::EINVAL) | Some(libc::EIO)
            ),
            "at {offset}: {error}"
        );
        drop(file);
        assert_eq!(std::fs::read(m.path("f")).unwrap(), b"hello", "at {offset}");
    }
    std::fs::write(m.path("g"), b"still serving").unwrap();
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"still serving");
    m.umount();
}

/// Runs travel in the background (write-behind): one that cannot land, a RAID-0 file with a
/// server stopped, is reported to the writer by a later `write`, by `fsync` or by `close`,
/// never dropped; and the mount serves the files it can.
#[test]
fn a_write_that_cannot_land_is_reported_not_lost() {
    use std::io::Write;
    let mut m = Mounted::start_mounted_with(&[], &["--scheme", "raid0"]);
    std::fs::write(m.path("f"), b"first").unwrap();
    let dir = m.root.path().join("cluster");
    ok(tessera(&["server", "stop", "2", "--dir", text(&dir)]));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap();
    let chunk = vec![7u8; 1 << 20];
    let mut reported = None;
    for _ in 0..48 {
        if let Err(e) = file.write_all(&chunk) {
            reported = Some(e);
            break;
        }
    }
    let reported = reported.or_else(|| file.sync_all().err());
    let error = reported.expect("48 MiB over a stopped RAID-0 server were taken and synced");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    drop(file);
    ok(tessera(&["server", "start", "2", "--dir", text(&dir)]));
    std::fs::write(m.path("g"), b"still serving").unwrap();
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"still serving");
    m.umount();
}

/// POSIX cases the pjdfstest run found: a name longer than 255 bytes is refused with
/// `ENAMETOOLONG`; a directory's link count is 2 plus its subdirectories; a file unlinked
/// (or replaced by a rename) while open stays readable and writable through its handle,
/// with a link count of 0, and is gone once the handle closes.
#[test]
fn long_names_directory_links_and_files_unlinked_while_open() {
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::start();
    let long = "n".repeat(256);
    let error = std::fs::write(m.path(&long), b"x").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENAMETOOLONG), "{error}");
    let error = std::fs::create_dir(m.path(&long)).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENAMETOOLONG), "{error}");
    std::fs::write(m.path(&long[..255]), b"255 bytes is fine").unwrap();

    std::fs::create_dir_all(m.path("d/a")).unwrap();
    std::fs::create_dir(m.path("d/b")).unwrap();
    std::fs::write(m.path("d/f"), b"a file is not a link").unwrap();
    assert_eq!(std::fs::metadata(m.path("d")).unwrap().nlink(), 4);
    assert_eq!(std::fs::metadata(m.path("d/a")).unwrap().nlink(), 2);

    std::fs::write(m.path("open"), b"still here").unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("open"))
        .unwrap();
    std::fs::remove_file(m.path("open")).unwrap();
    assert!(!m.path("open").exists(), "an unlinked name is gone");
    assert_eq!(file.metadata().unwrap().nlink(), 0);
    file.write_at(b" and writable", 10).unwrap();
    let mut read = vec![0u8; 23];
    file.read_exact_at(&mut read, 0).unwrap();
    assert_eq!(&read, b"still here and writable");
    // A rename over an open file: its handle keeps the old bytes.
    std::fs::write(m.path("old"), b"old bytes").unwrap();
    std::fs::write(m.path("new"), b"new bytes").unwrap();
    let replaced = std::fs::File::open(m.path("old")).unwrap();
    std::fs::rename(m.path("new"), m.path("old")).unwrap();
    let mut old = vec![0u8; 9];
    replaced.read_exact_at(&mut old, 0).unwrap();
    assert_eq!(&old, b"old bytes");
    assert_eq!(std::fs::read(m.path("old")).unwrap(), b"new bytes");
    let root: Vec<String> = std::fs::read_dir(&m.mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!root.iter().any(|n| n.starts_with(".tessera")), "{root:?}");
    drop((file, replaced));
    // Closed: nothing of either is left in the cluster.
    let listed = ok(m.cli(&["ls"]));
    assert!(
        !listed.contains(".tessera-unlinked/"),
        "left over:\n{listed}"
    );
    m.umount();
}

#[test]
fn directory_times_follow_changes_of_their_entries() {
    use std::time::{Duration, SystemTime};
    let m = Mounted::start();
    let mtime = |path: &str| std::fs::metadata(m.path(path)).unwrap().modified().unwrap();
    // Each step after a pause, so that a time that moved is later by more than the clock's
    // resolution.
    let pause = || std::thread::sleep(Duration::from_millis(20));
    let started = SystemTime::now();
    std::fs::create_dir(m.path("d")).unwrap();
    let made = mtime("d");
    assert!(made >= started, "a new directory has the time it was made");
    let mut last = made;
    let mut step = |what: &str, change: &dyn Fn()| {
        pause();
        change();
        let now = mtime("d");
        assert!(now > last, "{what} did not move the directory's time");
        last = now;
    };
    step("create", &|| std::fs::write(m.path("d/f"), b"x").unwrap());
    step("rename inside", &|| {
        std::fs::rename(m.path("d/f"), m.path("d/g")).unwrap()
    });
    step("mkdir", &|| std::fs::create_dir(m.path("d/sub")).unwrap());
    step("rmdir", &|| std::fs::remove_dir(m.path("d/sub")).unwrap());
    step("unlink", &|| std::fs::remove_file(m.path("d/g")).unwrap());
    std::fs::write(m.path("elsewhere"), b"y").unwrap();
    step("rename into", &|| {
        std::fs::rename(m.path("elsewhere"), m.path("d/in")).unwrap()
    });
    // Writing a file's bytes changes the file's time, not its directory's.
    pause();
    std::fs::write(m.path("d/in"), b"new bytes").unwrap();
    assert_eq!(mtime("d"), last);
    // utimensat on a directory is kept, and the time goes with a rename of the directory.
    let set = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    std::fs::File::open(m.path("d"))
        .unwrap()
        .set_modified(set)
        .unwrap();
    assert_eq!(mtime("d"), set);
    std::fs::rename(m.path("d"), m.path("e")).unwrap();
    assert_eq!(
        std::fs::metadata(m.path("e")).unwrap().modified().unwrap(),
        set
    );
    // The root's time moved with the rename of `d`.
    assert!(
        std::fs::metadata(&m.mountpoint)
            .unwrap()
            .modified()
            .unwrap()
            > made
    );
}

/// A path's (access, modification, change) times as `stat` shows them.
fn stat_times(path: &std::path::Path) -> [std::time::SystemTime; 3] {
    use std::time::{Duration, UNIX_EPOCH};
    let meta = std::fs::metadata(path).unwrap();
    let at = |secs: i64, nanos: i64| UNIX_EPOCH + Duration::new(secs as u64, nanos as u32);
    [
        at(meta.atime(), meta.atime_nsec()),
        at(meta.mtime(), meta.mtime_nsec()),
        at(meta.ctime(), meta.ctime_nsec()),
    ]
}

#[test]
fn access_modification_and_change_times_follow_posix() {
    use std::time::{Duration, SystemTime};
    let mut m = Mounted::start();
    let f = m.path("f");
    let pause = || std::thread::sleep(Duration::from_millis(20));
    let started = SystemTime::now();
    std::fs::write(&f, b"abc").unwrap();
    let [a, mt, c] = stat_times(&f);
    assert!(
        a >= started && mt >= a && c >= mt,
        "new file: {a:?} {mt:?} {c:?}"
    );
    // utimensat: access and modification as given, change time now.
    pause();
    let (set_a, set_m) = (
        SystemTime::UNIX_EPOCH + Duration::new(1_000_000_000, 5),
        SystemTime::UNIX_EPOCH + Duration::new(1_100_000_000, 7),
    );
    let times = std::fs::FileTimes::new()
        .set_accessed(set_a)
        .set_modified(set_m);
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_times(times)
        .unwrap();
    let [a, mt, c1] = stat_times(&f);
    assert_eq!((a, mt), (set_a, set_m), "utimensat");
    assert!(c1 > c, "utimensat did not change the change time");
    // A read records the access (it is older than the last change); a second one does not
    // (relatime). Neither modifies nor changes the file.
    pause();
    let before_read = SystemTime::now();
    assert_eq!(std::fs::read(&f).unwrap(), b"abc");
    // Past the kernel's attribute cache (the mount's TTL, 1 s): the access time is what
    // the mount answers.
    std::thread::sleep(Duration::from_millis(1100));
    let [a1, mt1, c2] = stat_times(&f);
    assert!(a1 >= before_read, "a read did not record the access");
    assert_eq!(
        (mt1, c2),
        (set_m, c1),
        "a read modified or changed the file"
    );
    pause();
    std::fs::read(&f).unwrap();
    assert_eq!(stat_times(&f), [a1, mt1, c2], "relatime: no second access");
    // A write modifies and changes, stat shows it before the file is closed; the access
    // time stays.
    pause();
    let mut file = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    file.write_all(b"def").unwrap();
    let [a2, mt2, c3] = stat_times(&f);
    assert!(mt2 > c2 && c3 >= mt2, "write: {mt2:?} {c3:?}");
    drop(file);
    let [a3, mt3, c4] = stat_times(&f);
    assert_eq!((a2, a3), (a1, a1), "a write moved the access time");
    assert!(mt3 >= mt2 && c4 >= mt3, "after close: {mt3:?} {c4:?}");
    // A truncation modifies and changes.
    pause();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(2)
        .unwrap();
    let [_, mt4, c5] = stat_times(&f);
    assert!(mt4 > mt3 && c5 > c4, "truncate did not modify and change");
    // A rename and a chmod change the file without modifying it.
    pause();
    let g = m.path("g");
    std::fs::rename(&f, &g).unwrap();
    let [_, mt5, c6] = stat_times(&g);
    assert!(mt5 == mt4 && c6 > c5, "rename: {mt5:?} {c6:?}");
    pause();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o644)).unwrap();
    let [a7, mt7, c7] = stat_times(&g);
    assert!(mt7 == mt4 && c7 > c6, "chmod: {mt7:?} {c7:?}");
    // Directories: utimensat keeps both times given.
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::File::open(m.path("d"))
        .unwrap()
        .set_times(times)
        .unwrap();
    let [da, dm, dc] = stat_times(&m.path("d"));
    assert_eq!((da, dm), (set_a, set_m), "utimensat on a directory");
    // The manager keeps them all: the same after a remount.
    m.umount();
    m.mount();
    assert_eq!(stat_times(&g), [a7, mt7, c7], "file times after a remount");
    assert_eq!(stat_times(&m.path("d")), [da, dm, dc], "directory times");
    m.umount();
}

#[test]
fn mount_refuses_bad_mountpoints_and_umount_a_non_mount() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("missing");
    let out = tessera(&["--cluster", "127.0.0.1:1", "mount", text(&missing)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("missing"), "{err}");
    let out = tessera(&["umount", text(root.path())]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Tessera mount"));
}

/// Paths the store holds that no directory listing can show (an empty name, from `/abs`,
/// `x/` or `a//b`, or a name over 255 bytes, all possible through the CLI and S3) are left
/// out of the listing, which once failed whole with EIO; the rest is listed and read.
#[test]
fn names_a_listing_cannot_show_leave_the_rest_listed() {
    let m = Mounted::start();
    let local = m.root.path().join("local");
    std::fs::write(&local, b"plain bytes").unwrap();
    let long = format!("d/{}", "n".repeat(300));
    for path in ["/abs", "x/", "a//b", long.as_str(), "plain"] {
        ok(m.cli(&["put", text(&local), path]));
    }
    let names = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(m.path(dir))
            .unwrap_or_else(|e| panic!("listing '{dir}': {e}"))
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(""), vec!["a", "d", "plain", "x"]);
    for dir in ["a", "d", "x"] {
        assert!(names(dir).is_empty(), "{dir}: {:?}", names(dir));
    }
    assert_eq!(std::fs::read(m.path("plain")).unwrap(), b"plain bytes");
    // The CLI still reaches what the mount does not show.
    let fetched = m.root.path().join("fetched");
    ok(m.cli(&["get", "x/", text(&fetched)]));
    assert_eq!(std::fs::read(&fetched).unwrap(), b"plain bytes");
}

/// A shrinking truncation zeroes only what the file holds: a sparse 8 GiB file (bytes
/// written at its start and its end) cut to 100 bytes writes next to nothing (it once wrote
/// zeros over the whole tail, which filled a disk), and growing it again shows zeros where
/// the last byte was.
#[test]
fn truncating_a_sparse_file_writes_only_what_it_held() {
    use std::os::unix::fs::FileExt;
    let m = Mounted::start();
    let path = m.path("sparse");
    let far = 8u64 << 30;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.write_all_at(b"head", 0).unwrap();
    file.write_all_at(b"x", far).unwrap();
    file.sync_all().unwrap();
    file.set_len(100).unwrap();
    file.set_len(far + 1).unwrap();
    let mut byte = [7u8; 1];
    file.read_exact_at(&mut byte, far).unwrap();
    assert_eq!(byte, [0], "the byte cut off shows again after growing");
    let mut head = [0u8; 4];
    file.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"head");
    file.sync_all().unwrap();
    drop(file);
    let stat: serde_json::Value =
        serde_json::from_str(&ok(m.cli(&["stat", "sparse", "--json"]))).unwrap();
    assert_eq!(stat["size"], far + 1);
    let stored = stat["stored_bytes"].as_u64().unwrap();
    assert!(stored < 64 << 20, "{stored} bytes stored for two written");
}

/// Cutting a written file to nothing with no handle open on it (an `O_TRUNC` open, as `cp`
/// and `>` do) replaces it with an empty file instead of writing zeros over it: what is
/// stored afterwards is the new bytes, not a file's worth of zeros. (The file is written by
/// the CLI: a handle of the mount closed just before may not be released yet, and then the
/// mount zeroes instead.)
#[test]
fn an_o_trunc_open_over_a_written_file_writes_no_zeros() {
    let m = Mounted::start();
    let path = m.path("dense");
    let local = tempfile::NamedTempFile::new().unwrap();
    let old: Vec<u8> = (0..32u32 << 20).map(|i| (i ^ (i >> 11)) as u8).collect();
    std::fs::write(local.path(), &old).unwrap();
    ok(m.cli(&["put", text(local.path()), "dense"]));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), old.len() as u64);
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(b"new").unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    // Growing it shows zeros, not the old bytes.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let back = std::fs::read(&path).unwrap();
    assert_eq!(&back[..3], b"new");
    assert!(back[3..].iter().all(|&b| b == 0), "old bytes showed again");
    let stat: serde_json::Value =
        serde_json::from_str(&ok(m.cli(&["stat", "dense", "--json"]))).unwrap();
    let stored = stat["stored_bytes"].as_u64().unwrap();
    assert!(stored < 4 << 20, "{stored} bytes stored for 3 written");
}

/// Truncations through a handle held open (`ftruncate`) of a dense file write no zeros over
/// what they cut: the stripes past the new end are discarded at the servers, so what is
/// stored shrinks with the file, and growing it again shows zeros.
#[test]
fn a_truncation_through_a_held_handle_discards_what_it_cuts() {
    let m = Mounted::start();
    let path = m.path("dense");
    let local = tempfile::NamedTempFile::new().unwrap();
    let old: Vec<u8> = (0..32u32 << 20).map(|i| (i ^ (i >> 13)) as u8).collect();
    std::fs::write(local.path(), &old).unwrap();
    ok(m.cli(&["put", text(local.path()), "dense"]));
    let stored = || -> u64 {
        let stat: serde_json::Value =
            serde_json::from_str(&ok(m.cli(&["stat", "dense", "--json"]))).unwrap();
        stat["stored_bytes"].as_u64().unwrap()
    };
    let before = stored();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let cut = (5 << 20) + 123;
    file.set_len(cut).unwrap();
    file.sync_all().unwrap();
    let after = stored();
    assert!(
        after < before / 4,
        "{after} bytes stored after cutting to {cut}, {before} before"
    );
    file.set_len(old.len() as u64).unwrap();
    let back = std::fs::read(&path).unwrap();
    assert_eq!(back.len(), old.len());
    assert!(
        back[..cut as usize] == old[..cut as usize],
        "kept bytes changed"
    );
    assert!(
        back[cut as usize..].iter().all(|&b| b == 0),
        "old bytes showed again"
    );
    file.set_len(0).unwrap();
    file.sync_all().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    let emptied = stored();
    assert!(
        emptied < 64 << 10,
        "{emptied} bytes stored for an empty file"
    );
    drop(file);
}

/// A seeded generator for the fsx run (xorshift: the run replays from its seed alone).
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// An fsx-style run: random writes (small, unaligned, stripe-crossing, and some larger than
/// the write-back buffer), reads, truncations up and down, fsyncs, closes and reopens, over
/// two handles open on one file at once, every read and every size checked against a model
/// of the file. Then the file is read whole through a fresh mount and with the CLI. RAID-5
/// with a 64 KiB stripe unit, so most writes are partial-stripe read-modify-writes.
/// `TESSERA_FSX_OPS` sets the number of operations (default 1,500), `TESSERA_TEST_SEED` the
/// seed.
#[test]
fn fsx_random_operations_agree_with_a_model() {
    let ops: u64 = std::env::var("TESSERA_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    let seed: u64 = std::env::var("TESSERA_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::random::<u64>() | 1);
    println!("fsx: {ops} operations, seed {seed} (replay with TESSERA_TEST_SEED={seed})");
    let mut m = Mounted::start_mounted_with(&[], &["--scheme", "raid5", "--stripe-unit", "64K"]);
    let model = fsx_run(&m, ops, &mut Dice(seed));
    m.umount();
    m.mount();
    let back = std::fs::read(m.path("fsx")).unwrap();
    assert_eq!(back.len(), model.len(), "size after remount");
    assert!(back == model, "bytes after remount differ from the model");
    let fetched = m.root.path().join("fetched");
    ok(m.cli(&["get", "fsx", text(&fetched)]));
    assert!(
        std::fs::read(&fetched).unwrap() == model,
        "the CLI reads other bytes"
    );
    m.umount();
}

/// The largest size the run lets the file reach.
const FSX_SIZE_MAX: u64 = 24 << 20;

fn fsx_open(m: &Mounted) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.path("fsx"))
        .unwrap()
}

/// Runs `ops` random operations on file `fsx`; returns the model of what it holds. A
/// failure names the operation and the ones before it.
fn fsx_run(m: &Mounted, ops: u64, dice: &mut Dice) -> Vec<u8> {
    let mut model: Vec<u8> = Vec::new();
    let mut handles = [fsx_open(m), fsx_open(m)];
    let mut recent: std::collections::VecDeque<String> = Default::default();
    for op in 0..ops {
        let h = dice.below(2) as usize;
        let what = dice.below(100);
        let context = format!(
            "operation {op} on handle {h}, after:\n  {}\n",
            Vec::from(recent.clone()).join("\n  ")
        );
        let done = match what {
            0..=44 => fsx_write(&mut handles[h], &mut model, dice, &context),
            45..=79 => fsx_read(&mut handles[h], &model, dice, &context),
            80..=87 => {
                let size = dice.below(FSX_SIZE_MAX);
                let truncated = handles[h].set_len(size);
                truncated.unwrap_or_else(|e| panic!("{context}: truncate to {size}: {e}"));
                model.resize(size as usize, 0);
                format!("truncate to {size}")
            }
            88..=92 => {
                let synced = handles[h].sync_all();
                synced.unwrap_or_else(|e| panic!("{context}: fsync: {e}"));
                "fsync".to_string()
            }
            93..=96 => {
                handles[h] = fsx_open(m);
                "reopen".to_string()
            }
            _ => {
                let len = handles[h].metadata().unwrap().len();
                assert_eq!(len, model.len() as u64, "{context}: size");
                "stat".to_string()
            }
        };
        recent.push_back(format!("{op} h{h}: {done}"));
        if recent.len() > 16 {
            recent.pop_front();
        }
    }
    for handle in &handles {
        handle.sync_all().unwrap();
    }
    model
}

fn fsx_write(
    file: &mut std::fs::File,
    model: &mut Vec<u8>,
    dice: &mut Dice,
    context: &str,
) -> String {
    let len = match dice.below(20) {
        0 => (9 << 20) + dice.below(1 << 20),
        1..=4 => dice.below(1 << 20) + 1,
        _ => dice.below(96 << 10) + 1,
    };
    let offset = dice.below(FSX_SIZE_MAX - len);
    let bytes = random_bytes(len as usize, dice.next());
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&bytes)
        .unwrap_or_else(|e| panic!("{context}: write of {len} at {offset}: {e}"));
    let end = (offset + len) as usize;
    if model.len() < end {
        model.resize(end, 0);
    }
    model[offset as usize..end].copy_from_slice(&bytes);
    format!("write {len} at {offset} (to {end})")
}

fn fsx_read(file: &mut std::fs::File, model: &[u8], dice: &mut Dice, context: &str) -> String {
    let size = model.len() as u64;
    let offset = dice.below(size + 1);
    let len = dice.below(1 << 20).min(size - offset + 4096);
    let mut got = vec![0u8; len as usize];
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut filled = 0;
    while filled < got.len() {
        let read = file.read(&mut got[filled..]);
        match read.unwrap_or_else(|e| panic!("{context}: read of {len} at {offset}: {e}")) {
            0 => break,
            n => filled += n,
        }
    }
    let want_end = (offset + len).min(size) as usize;
    let want = &model[offset as usize..want_end];
    assert_eq!(
        filled,
        want.len(),
        "{context}: read of {len} at {offset}: length"
    );
    if let Some(at) = (0..filled).find(|&i| got[i] != want[i]) {
        panic!(
            "{context}: read of {len} at {offset} differs from the model at byte {} of {filled}",
            offset + at as u64
        );
    }
    format!("read {len} at {offset}")
}
