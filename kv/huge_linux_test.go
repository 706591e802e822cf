package kv

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// vmFlags returns the VmFlags of the mapping of this process that holds
// addr, from /proc/self/smaps.
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		// A mapping's first line starts with its range, "lo-hi"; the
		// lines after it are "Key: value".
		if f := strings.Fields(line); len(f) > 0 && !strings.HasSuffix(f[0], ":") {
			var lo, hi uintptr
			if _, err := fmt.Sscanf(f[0], "%x-%x", &lo, &hi); err == nil {
				in = lo <= addr && addr < hi
			}
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.Fields(strings.TrimPrefix(line, "VmFlags:"))
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return nil
}

// A large table's slots are advised for huge pages: the kernel marks the
// mapping that holds them ("hg" in smaps), whatever its system-wide
// setting, and the data stays as it was.
func TestLargeTablesAskForHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("this kernel has no transparent huge pages")
	}
	// Whether this kernel, in this container, marks a mapping advised
	// directly: if not, there is nothing for the table to get.
	probe, err := syscall.Mmap(-1, 0, 2*hugePage, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(probe)
	if err := syscall.Madvise(probe, syscall.MADV_HUGEPAGE); err != nil {
		t.Skipf("the kernel refuses MADV_HUGEPAGE: %v", err)
	}
	if !slices.Contains(vmFlags(t, uintptr(unsafe.Pointer(&probe[0]))), "hg") {
		t.Skip("the kernel does not mark advised mappings in smaps")
	}
	x := NewIndex(1 << 20) // 2M slots of 16 bytes: 32 MiB
	for i := 1; i <= 1000; i++ {
		x.Put(BlockHash(i*7919), int32(i))
	}
	mid := uintptr(unsafe.Pointer(&x.slots[len(x.slots)/2]))
	flags := vmFlags(t, mid)
	if !slices.Contains(flags, "hg") {
		t.Fatalf("a 32 MiB table's mapping is not advised for huge pages: VmFlags %v", flags)
	}
	for i := 1; i <= 1000; i++ {
		if v, ok := x.Get(BlockHash(i * 7919)); !ok || v != int32(i) {
			t.Fatalf("entry %d: %d %v", i, v, ok)
		}
	}
}

// Empty slices, slices with no whole aligned huge page in them and ones
// with one are advised without a fault, and keep their data.
func TestAdviseHugePagesSmallSlices(t *testing.T) {
	AdviseHugePages([]int32(nil))
	AdviseHugePages(make([]byte, 4096))
	s := make([]byte, hugePage)
	for i := range s {
		s[i] = byte(i)
	}
	AdviseHugePages(s)
	for i := range s {
		if s[i] != byte(i) {
			t.Fatalf("byte %d changed", i)
		}
	}
}
