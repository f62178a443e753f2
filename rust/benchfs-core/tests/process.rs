//! The process's descriptor count, checked in a test binary of its own: the library's unit tests run
//! in parallel threads that open and close descriptors, which moved the count by a hundred.

use benchfs_core::process::{cpu_ns, open_descriptors, raise_descriptor_limit, resident_bytes};

#[test]
fn the_limit_is_raised_and_use_is_counted() {
    let limit = raise_descriptor_limit().expect("getrlimit");
    let before = open_descriptors();
    let files: Vec<std::fs::File> = (0..1000)
        .map(|_| std::fs::File::open("/dev/null").expect("open"))
        .collect();
    assert!(limit > before + 1000);
    assert_eq!(open_descriptors(), before + 1000);
    drop(files);
    assert_eq!(open_descriptors(), before);
    assert!(resident_bytes() > 1 << 20);
    let before = cpu_ns();
    let mut x = 0u64;
    for i in 0..10_000_000u64 {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    assert!(cpu_ns() > before, "{x}");
}
