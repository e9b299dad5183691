//! The few OS calls std does not wrap.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Percentage of the file system holding `path` that is in use, as `df` shows it.
pub fn disk_used_percent(path: &Path) -> Option<f64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable
    // memory of the right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    let total = st.f_blocks as f64;
    let avail = st.f_bavail as f64;
    let free = st.f_bfree as f64;
    let used = total - free;
    if used + avail <= 0.0 {
        return None;
    }
    Some(used * 100.0 / (used + avail))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reports_a_percentage() {
        let p = super::disk_used_percent(std::path::Path::new("/"));
        assert!(p.is_some_and(|p| (0.0..=100.0).contains(&p)));
    }
}
