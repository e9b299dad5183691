//! The few OS calls std does not wrap.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// statvfs(3) of the file system holding `path`.
fn statvfs(path: &Path) -> Option<libc::statvfs> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable
    // memory of the right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so the struct is initialised.
    Some(unsafe { st.assume_init() })
}

/// Percentage of the file system holding `path` that is in use, as `df` shows it.
pub fn disk_used_percent(path: &Path) -> Option<f64> {
    let st = statvfs(path)?;
    let total = st.f_blocks as f64;
    let avail = st.f_bavail as f64;
    let free = st.f_bfree as f64;
    let used = total - free;
    if used + avail <= 0.0 {
        return None;
    }
    Some(used * 100.0 / (used + avail))
}

/// (total, available to unprivileged users) bytes of the file system
/// holding `path`.
// statvfs's field types differ between platforms (u32 on some 32-bit ones).
#[allow(clippy::unnecessary_cast)]
pub fn disk_space(path: &Path) -> Option<(u64, u64)> {
    let st = statvfs(path)?;
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// Physical memory of this machine (`MemTotal` of /proc/meminfo), read once.
pub fn total_memory_bytes() -> Option<u64> {
    static TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    })
}

/// fsyncs a directory (after creating or removing a name in it).
pub(crate) fn fsync_dir(dir: &Path) -> crate::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(crate::StoreError::io("fsync", dir))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_machine_memory() {
        assert!(super::total_memory_bytes().is_some_and(|b| b > 1 << 20));
    }

    #[test]
    fn reports_a_percentage() {
        let p = super::disk_used_percent(std::path::Path::new("/"));
        assert!(p.is_some_and(|p| (0.0..=100.0).contains(&p)));
    }
}
