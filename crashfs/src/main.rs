//! `firstseen-crashfs --backing DIR --mount DIR --control SOCKET`
//!
//! Mounts `DIR` at the mount point, prints `ready` once both the mount and
//! the control socket are up, then answers one command per line on the
//! socket, each with one line:
//!
//! - `power-off`: writes from now on are dropped and fsyncs keep nothing,
//!   until the next `lose-power*` (for a process that is stopped by being
//!   dropped, not killed) → `ok`
//! - `lose-power`: every write not yet fsynced is undone, and every name
//!   change (create, unlink, rmdir, rename) whose directory was not fsynced
//!   since → `ok files=N bytes=B torn=0 names=N`
//! - `lose-power-torn SEED`: the same, then each file's last lost write is
//!   re-applied up to a random byte (seeded)
//! - `quota BYTES` / `quota off`: writes beyond BYTES of file data fail with ENOSPC
//! - `freeze`: the storage stalls; every write, fsync and fsyncdir from now
//!   on is held unanswered (its caller blocks) → `ok`
//! - `thaw`: the held writes and syncs are carried out in the order they
//!   came and answered; later ones pass again → `ok held=N`
//! - `status` → `ok used=B quota=B|off unsynced=B names=N writes=N fsyncs=N enospc=N frozen=0|1 held=N`
//! - `unmount`: unmounts and exits
//!
//! With `--exit-on-stdin-eof` it also unmounts and exits when its standard
//! input closes: a test that keeps the pipe's other end open then never
//! leaves a mount behind, even when it dies without cleaning up (a panic
//! on another thread, a timeout, SIGKILL).
//!
//! A power cut is meant for a moment when nothing writes: kill the process
//! using the filesystem first, as the power would.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;

use firstseen_crashfs::fs::CrashFs;
use fuser::{Config, MountOption};

fn usage() -> ExitCode {
    eprintln!(
        "usage: firstseen-crashfs --backing DIR --mount DIR --control SOCKET [--exit-on-stdin-eof]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut backing = None;
    let mut mount = None;
    let mut control = None;
    let mut lifeline = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--backing" => backing = args.next().map(PathBuf::from),
            "--mount" => mount = args.next().map(PathBuf::from),
            "--control" => control = args.next().map(PathBuf::from),
            "--exit-on-stdin-eof" => lifeline = true,
            _ => return usage(),
        }
    }
    let (Some(backing), Some(mount), Some(control)) = (backing, mount, control) else {
        return usage();
    };
    if let Err(e) = std::fs::create_dir_all(&backing).and_then(|_| std::fs::create_dir_all(&mount))
    {
        eprintln!("firstseen-crashfs: {e}");
        return ExitCode::from(2);
    }
    let fs = match CrashFs::new(backing.clone()) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!(
                "firstseen-crashfs: cannot make the stash in {}: {e}",
                backing.display()
            );
            return ExitCode::from(2);
        }
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("firstseen-crashfs".into()),
        MountOption::RW,
    ];
    config.n_threads = Some(2);
    let session = match fuser::spawn_mount(fs.clone(), &mount, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("firstseen-crashfs: cannot mount {}: {e}", mount.display());
            return ExitCode::from(2);
        }
    };
    let _ = std::fs::remove_file(&control);
    let listener = match UnixListener::bind(&control) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "firstseen-crashfs: control socket {}: {e}",
                control.display()
            );
            drop(session);
            return ExitCode::from(2);
        }
    };
    if lifeline {
        let control = control.clone();
        std::thread::spawn(move || {
            // Reads until the other end closes; what it says is ignored.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            // The main loop unmounts on this command, as if a test sent it.
            if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&control) {
                let _ = writeln!(s, "unmount");
            }
        });
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mut out = match conn.try_clone() {
            Ok(o) => o,
            Err(_) => continue,
        };
        let mut quit = false;
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { break };
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["power-off"] => {
                    fs.power_off();
                    "ok".to_string()
                }
                ["lose-power"] => lost(fs.lose_power(None)),
                ["lose-power-torn", seed] => match seed.parse() {
                    Ok(seed) => lost(fs.lose_power(Some(seed))),
                    Err(_) => "error: the seed is not a number".to_string(),
                },
                ["quota", "off"] => {
                    fs.set_quota(None);
                    "ok".to_string()
                }
                ["quota", bytes] => match bytes.parse() {
                    Ok(b) => {
                        fs.set_quota(Some(b));
                        "ok".to_string()
                    }
                    Err(_) => "error: the quota is not a number of bytes".to_string(),
                },
                ["freeze"] => {
                    fs.freeze();
                    "ok".to_string()
                }
                ["thaw"] => format!("ok held={}", fs.thaw()),
                ["status"] => {
                    let (used, quota, unsynced, s) = fs.report();
                    let (frozen, held) = fs.frozen();
                    format!(
                        "ok used={used} quota={} unsynced={unsynced} names={} writes={} fsyncs={} enospc={} frozen={} held={held}",
                        quota.map_or("off".to_string(), |q| q.to_string()),
                        fs.pending_names(),
                        s.writes,
                        s.fsyncs,
                        s.enospc,
                        u8::from(frozen)
                    )
                }
                ["unmount"] => {
                    quit = true;
                    "ok".to_string()
                }
                _ => format!("error: unknown command `{line}`"),
            };
            if writeln!(out, "{reply}").is_err() || quit {
                break;
            }
        }
        if quit {
            break;
        }
    }
    let _ = std::fs::remove_file(&control);
    match session.umount_and_join() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Busy: files are still open (a test process that is dying
            // closes them a moment after its pipe). Without this process
            // the mount would stay behind, dead; a lazy unmount detaches it
            // now and lets the kernel finish once the files are closed.
            eprintln!("firstseen-crashfs: unmount: {e}; detaching it lazily");
            if lazy_unmount(&mount) {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "firstseen-crashfs: could not detach {}; `umount -l` it by hand",
                    mount.display()
                );
                ExitCode::from(1)
            }
        }
    }
}

/// `fusermount3 -uz`, `fusermount -uz` or `umount -l`, whichever works.
fn lazy_unmount(mount: &std::path::Path) -> bool {
    let tries: [(&str, &[&str]); 3] = [
        ("fusermount3", &["-uz"]),
        ("fusermount", &["-uz"]),
        ("umount", &["-l"]),
    ];
    tries.iter().any(|(tool, args)| {
        std::process::Command::new(tool)
            .args(*args)
            .arg(mount)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn lost(r: std::io::Result<firstseen_crashfs::journal::Lost>) -> String {
    match r {
        Ok(l) => format!(
            "ok files={} bytes={} torn={} names={}",
            l.files, l.bytes, l.torn_bytes, l.names
        ),
        Err(e) => format!("error: {e}"),
    }
}
