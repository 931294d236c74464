//! Host memory behind buffers: owned, 64-byte aligned, zeroed allocations, or
//! read-only bytes someone else owns (a memory-mapped GGUF file).

use crate::RuntimeError;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

/// Read-only host bytes a buffer can wrap without copying (e.g. an mmap).
pub trait HostBytes: Send + Sync + 'static {
    fn host_bytes(&self) -> &[u8];
}

impl HostBytes for memmap2::Mmap {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

impl HostBytes for Vec<u8> {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

const ALIGN: usize = 64;

enum Backing {
    Owned {
        ptr: NonNull<u8>,
        layout: Layout,
    },
    Borrowed(Arc<dyn HostBytes>),
    /// Device memory (CUDA); the host never dereferences it.
    #[cfg(feature = "cuda")]
    Device(crate::cuda::DeviceBuffer),
    /// Metal shared memory (the host reads and writes it in place once
    /// in-flight work has completed).
    #[cfg(all(feature = "metal", target_os = "macos"))]
    Metal(crate::metal::MetalStorage),
}

/// The memory of one buffer.
pub(crate) struct Storage {
    backing: Backing,
    len: usize,
}

// SAFETY: Storage is a fixed allocation; concurrent access to its bytes is
// coordinated by the schedule (no two nodes of one level touch overlapping
// bytes where one writes) and by waiting for in-flight work before host reads
// or writes.
unsafe impl Send for Storage {}
// SAFETY: as above.
unsafe impl Sync for Storage {}

impl Storage {
    /// Zeroed, 64-byte aligned memory of `len` bytes (at least one byte is
    /// allocated so every buffer has a distinct address).
    pub(crate) fn owned(len: usize, name: &str) -> Result<Storage, RuntimeError> {
        let oom = || RuntimeError::OutOfMemory {
            bytes: len as u64,
            name: name.to_string(),
        };
        let layout = Layout::from_size_align(len.max(1), ALIGN).map_err(|_| oom())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(oom)?;
        Ok(Storage {
            backing: Backing::Owned { ptr, layout },
            len,
        })
    }

    /// Wraps read-only bytes.
    pub(crate) fn borrowed(bytes: Arc<dyn HostBytes>) -> Storage {
        let len = bytes.host_bytes().len();
        Storage {
            backing: Backing::Borrowed(bytes),
            len,
        }
    }

    /// Device memory of `len` bytes.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(buffer: crate::cuda::DeviceBuffer) -> Storage {
        let len = buffer.len;
        Storage {
            backing: Backing::Device(buffer),
            len,
        }
    }

    /// Metal shared memory.
    #[cfg(all(feature = "metal", target_os = "macos"))]
    pub(crate) fn metal_storage(storage: crate::metal::MetalStorage) -> Storage {
        let len = storage.len;
        Storage {
            backing: Backing::Metal(storage),
            len,
        }
    }

    /// The Metal buffer behind Metal storage.
    #[cfg(all(feature = "metal", target_os = "macos"))]
    pub(crate) fn metal(&self) -> Option<&crate::metal::MetalStorage> {
        match &self.backing {
            Backing::Metal(m) => Some(m),
            _ => None,
        }
    }

    /// Device address, for device storage.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_ptr(&self) -> Option<u64> {
        match &self.backing {
            Backing::Device(b) => Some(b.ptr),
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn writable(&self) -> bool {
        !matches!(self.backing, Backing::Borrowed(_))
    }

    /// Host base address (`None` for device memory). Writing through it
    /// is allowed only for owned storage.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match &self.backing {
            Backing::Owned { ptr, .. } => Some(ptr.as_ptr()),
            Backing::Borrowed(b) => Some(b.host_bytes().as_ptr() as *mut u8),
            #[cfg(feature = "cuda")]
            Backing::Device(_) => None,
            #[cfg(all(feature = "metal", target_os = "macos"))]
            Backing::Metal(m) => Some(m.host_ptr()),
        }
    }

    /// Notes a host write of bytes `start..end` (Metal: an f32 image of
    /// activations in them is stale now).
    pub(crate) fn host_written(&self, start: u64, end: u64) {
        #[cfg(all(feature = "metal", target_os = "macos"))]
        if let Backing::Metal(m) = &self.backing {
            m.invalidate(start, end);
        }
        let _ = (start, end);
    }

    /// The host bytes (`None` for device memory). Callers make sure no work
    /// writing them is in flight.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        // SAFETY: host_ptr() points at len initialised bytes that live as long as self.
        self.host_ptr()
            .map(|p| unsafe { std::slice::from_raw_parts(p, self.len) })
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Backing::Owned { ptr, layout } = self.backing {
            // SAFETY: allocated in `owned` with this very layout.
            unsafe { dealloc(ptr.as_ptr(), layout) }
        }
    }
}
