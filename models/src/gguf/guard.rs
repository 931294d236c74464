//! A clean exit instead of a crash when a mapped model file is truncated.
//!
//! Weights are read in place from the memory-mapped file. If another
//! process truncates the file while it is mapped, the next read of a page
//! past the new end raises `SIGBUS`, which would kill the process with a
//! signal and no word of why. [`install_truncation_guard`] installs a
//! `SIGBUS` handler that checks whether the faulting address lies in a
//! mapped model file; if so it writes one line naming the file to stderr
//! (with async-signal-safe `write(2)` only) and exits with
//! [`TRUNCATED_EXIT_CODE`]. A fault anywhere else gets the default action
//! (the handler restores it and returns, and the faulting access runs
//! again). A file rewritten in place without changing its size cannot be
//! detected this way: it reads as other weights.
//!
//! Supported on Linux and macOS; elsewhere installing does nothing.

/// Exit status after a mapped model file was truncated (`EX_IOERR`):
/// below 128, so it does not read as death by a signal.
pub const TRUNCATED_EXIT_CODE: i32 = 74;

/// Installs the `SIGBUS` handler (idempotent). Call it once, early, in a
/// program that maps model files.
pub fn install_truncation_guard() {
    imp::install();
}

/// Registers the map of `path` at `start..start + len` (a no-op where the
/// guard is unsupported); the returned token unregisters it when dropped.
pub(crate) fn register(path: &std::path::Path, start: *const u8, len: usize) -> Registration {
    Registration(imp::register(path, start as usize, len))
}

/// A registered map; unregistered on drop.
pub(crate) struct Registration(Option<usize>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            imp::unregister(slot);
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "macos"))]
mod imp {
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Once;

    /// Maps tracked at once; a map beyond these is simply not named.
    const SLOTS: usize = 16;
    /// Bytes of a path kept for the message (longer ones are cut).
    const PATH_BYTES: usize = 1024;

    /// One registered map. `start` is written last (Release) and cleared
    /// first, so the handler only reads a slot whose path is complete.
    struct Slot {
        claimed: AtomicBool,
        start: AtomicUsize,
        len: AtomicUsize,
        path_len: AtomicUsize,
        path: UnsafeCell<[u8; PATH_BYTES]>,
    }

    // SAFETY: `path` is written only by the thread that claimed the slot
    // (the `claimed` flag), before `start` publishes it, and read (by the
    // signal handler) only after `start` is seen nonzero.
    unsafe impl Sync for Slot {}

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        claimed: AtomicBool::new(false),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        path_len: AtomicUsize::new(0),
        path: UnsafeCell::new([0; PATH_BYTES]),
    };

    static MAPS: [Slot; SLOTS] = [EMPTY; SLOTS];
    static INSTALL: Once = Once::new();

    pub fn install() {
        INSTALL.call_once(|| {
            // SAFETY: a zeroed `sigaction` is a valid value to fill in; the
            // handler has the three-argument form SA_SIGINFO asks for and
            // does only async-signal-safe things (atomic loads, write(2),
            // _exit(2), sigaction(2)).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigbus as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
            }
        });
    }

    pub fn register(path: &std::path::Path, start: usize, len: usize) -> Option<usize> {
        use std::os::unix::ffi::OsStrExt;
        if start == 0 || len == 0 {
            return None;
        }
        let i = MAPS.iter().position(|s| {
            s.claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let slot = &MAPS[i];
        let bytes = path.as_os_str().as_bytes();
        let n = bytes.len().min(PATH_BYTES);
        // SAFETY: this thread claimed the slot and `start` is 0, so no one
        // else writes the path and the handler does not read it.
        unsafe { (&mut (*slot.path.get()))[..n].copy_from_slice(&bytes[..n]) };
        slot.path_len.store(n, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.start.store(start, Ordering::Release);
        Some(i)
    }

    pub fn unregister(i: usize) {
        if let Some(slot) = MAPS.get(i) {
            slot.start.store(0, Ordering::Release);
            slot.claimed.store(false, Ordering::Release);
        }
    }

    fn write_stderr(bytes: &[u8]) {
        // SAFETY: write(2) is async-signal-safe; the buffer is valid for
        // `bytes.len()` bytes. A short or failed write loses the message,
        // nothing else.
        unsafe {
            libc::write(2, bytes.as_ptr().cast(), bytes.len());
        }
    }

    extern "C" fn on_sigbus(
        _sig: libc::c_int,
        info: *mut libc::siginfo_t,
        _ctx: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        for slot in &MAPS {
            let start = slot.start.load(Ordering::Acquire);
            let len = slot.len.load(Ordering::Relaxed);
            if start == 0 || addr < start || addr - start >= len {
                continue;
            }
            let n = slot.path_len.load(Ordering::Relaxed).min(PATH_BYTES);
            write_stderr(b"error: the model file ");
            // SAFETY: `start` was seen nonzero after the path was written.
            write_stderr(unsafe { &(&(*slot.path.get()))[..n] });
            write_stderr(
                b" changed or was truncated while mapped (a read of its data failed); \
                  weft reads model files in place and needs them unchanged while it runs\n",
            );
            // SAFETY: _exit(2) is async-signal-safe and never returns.
            unsafe { libc::_exit(super::TRUNCATED_EXIT_CODE) };
        }
        // Not a model file: the default action, on the access run again.
        // SAFETY: a zeroed sigaction with SIG_DFL restores the default.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod imp {
    pub fn install() {}

    pub fn register(_path: &std::path::Path, _start: usize, _len: usize) -> Option<usize> {
        None
    }

    pub fn unregister(_i: usize) {}
}
