//! A storage server's daemon stops cleanly on SIGTERM in every state, also before its manager
//! ever answered (it used to hear the signal only once registered, and died of it unsynced).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod command;
use command::{tessera, text};

extern "C" {
    fn kill(pid: i32, signal: i32) -> i32;
}

#[test]
fn a_server_whose_manager_never_answers_stops_cleanly_on_sigterm() {
    let root = tempfile::tempdir().expect("temporary directory");
    let dir = root.path().join("cluster");
    // A cluster only for its secret: the server is pointed at a port nobody listens on.
    let up = tessera(&["up", "--servers", "1", "--dir", text(&dir), "--detach"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let _ = tessera(&["down", "--dir", text(&dir)]);
    let secret = dir.join("cluster.secret");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let manager = dead.local_addr().unwrap().to_string();
    drop(dead);
    let mut server = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--secret", text(&secret), "server", "--manager", &manager])
        .args(["--listen", "127.0.0.1:0"])
        .args(["--dir", text(&root.path().join("store"))])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a server");
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("server exited").expect("read stderr");
        if line.contains("server listening on") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signals only the server this test started.
    assert_eq!(unsafe { kill(server.id() as i32, 15) }, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            panic!("the server did not stop within 15 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "the server ended with {status} (not a clean stop)"
    );
}
