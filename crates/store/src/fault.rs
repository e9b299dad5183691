//! Fault injection for tests: make the next N calls of a store I/O step fail
//! with a chosen errno, to prove the failure paths (EIO on msync, ENOSPC or
//! EMFILE on file creation) do what the store promises.
//!
//! Armed from code with [`inject`], or for a whole process from the
//! environment at [`crate::MessageStore::open`]:
//! `ROKKA_FAULTS="msync:EIO:1,create:ENOSPC:3"` (step:errno:count; count
//! `*` = every call). Unarmed, a check is one relaxed atomic load.
//!
//! Steps: `msync` (CommitLog write-back), `create` (creating or extending a
//! CommitLog segment, ConsumeQueue or index file), `dir-fsync` (making a
//! new file's name durable), `file-write` (a small file replaced whole: the
//! checkpoint, offsets, manifest, config tables).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ARMED: AtomicBool = AtomicBool::new(false);
static FAULTS: Mutex<Vec<Fault>> = Mutex::new(Vec::new());

#[derive(Debug, Clone)]
struct Fault {
    step: String,
    /// 0: no error, only the delay.
    errno: i32,
    delay_ms: u64,
    /// Calls left to fail; `None` = every call.
    left: Option<u32>,
}

/// Makes the next `times` calls of `step` fail with `errno` (`None` = all).
pub fn inject(step: &str, errno: i32, times: Option<u32>) {
    let mut f = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    f.push(Fault {
        step: step.to_string(),
        errno,
        delay_ms: 0,
        left: times,
    });
    ARMED.store(true, Ordering::Release);
}

/// Makes the next `times` calls of `step` take `ms` longer (then succeed):
/// a slow disk, for tests of what waits on what.
pub fn inject_delay(step: &str, ms: u64, times: Option<u32>) {
    let mut f = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    f.push(Fault {
        step: step.to_string(),
        errno: 0,
        delay_ms: ms,
        left: times,
    });
    ARMED.store(true, Ordering::Release);
}

/// Removes every injected fault.
pub fn clear() {
    FAULTS.lock().unwrap_or_else(|p| p.into_inner()).clear();
    ARMED.store(false, Ordering::Release);
}

fn errno_named(name: &str) -> Option<i32> {
    Some(match name {
        "EIO" => libc::EIO,
        "ENOSPC" => libc::ENOSPC,
        "EMFILE" => libc::EMFILE,
        "ENFILE" => libc::ENFILE,
        "EROFS" => libc::EROFS,
        "EDQUOT" => libc::EDQUOT,
        _ => return None,
    })
}

/// Arms the faults named in `ROKKA_FAULTS`, if set. A malformed entry is an
/// error naming it (a test that meant to inject must not silently not).
pub(crate) fn init_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var("ROKKA_FAULTS") else {
        return Ok(());
    };
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        let [step, errno, count] = parts[..] else {
            return Err(format!("ROKKA_FAULTS entry {item:?}: expected step:ERRNO:count"));
        };
        let errno = errno_named(errno).ok_or_else(|| format!("ROKKA_FAULTS entry {item:?}: unknown errno"))?;
        let times = match count {
            "*" => None,
            n => Some(
                n.parse()
                    .map_err(|_| format!("ROKKA_FAULTS entry {item:?}: bad count"))?,
            ),
        };
        tracing::warn!(step, errno, ?times, "fault injection armed (ROKKA_FAULTS)");
        inject(step, errno, times);
    }
    Ok(())
}

/// Fails if a fault is armed for `step` (using up one of its calls).
pub(crate) fn check(step: &str) -> io::Result<()> {
    if !ARMED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut faults = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(f) = faults.iter_mut().find(|f| f.step == step && f.left != Some(0)) else {
        return Ok(());
    };
    if let Some(n) = &mut f.left {
        *n -= 1;
    }
    if f.errno == 0 {
        let ms = f.delay_ms;
        drop(faults);
        std::thread::sleep(std::time::Duration::from_millis(ms));
        return Ok(());
    }
    Err(io::Error::from_raw_os_error(f.errno))
}
