package imagebuild

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// multiarch maps an ELF machine to Debian's multiarch triplet, which names
// the directories its dynamic loader searches.
var multiarch = map[elf.Machine]string{
	elf.EM_X86_64:  "x86_64-linux-gnu",
	elf.EM_AARCH64: "aarch64-linux-gnu",
}

// goarch maps an ELF machine to the OCI platform architecture.
var goarch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
}

// BinaryArch is the OCI architecture (Go's GOARCH) of the ELF executable
// at path: amd64 or arm64, the architectures images are built for.
func BinaryArch(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("read ELF %s: %w", path, err)
	}
	defer f.Close()
	arch, ok := goarch[f.Machine]
	if !ok {
		return "", fmt.Errorf("%s: machine %v is not supported (want x86-64 or aarch64)", path, f.Machine)
	}
	return arch, nil
}

// closure is the set of host files an image needs for some executables to
// run: the executables, their dynamic loader and every shared library they
// need, directly or through another library, by path as the loader will
// look them up (so /lib64/ld-linux-x86-64.so.2, not the file it links to).
type closure struct {
	root    string // the root the files are read under: "/" or a sysroot
	machine elf.Machine
	paths   []string        // image paths to copy, in the order found
	seen    map[string]bool // image paths and sonames already handled
}

func newClosure(root string) *closure {
	return &closure{root: root, seen: map[string]bool{}}
}

// addExecutable adds the dynamic loader and the libraries of the executable
// at hostPath to the closure. The executable itself is not added: the
// caller places it.
func (c *closure) addExecutable(hostPath string) error {
	f, err := elf.Open(hostPath)
	if err != nil {
		return fmt.Errorf("read ELF %s: %w", hostPath, err)
	}
	defer f.Close()
	if err := c.checkMachine(hostPath, f); err != nil {
		return err
	}
	interp, err := interpreter(f)
	if err != nil {
		return fmt.Errorf("%s: %w", hostPath, err)
	}
	if interp == "" {
		return nil // static: needs nothing
	}
	if !c.seen[interp] {
		c.seen[interp] = true
		c.paths = append(c.paths, interp)
	}
	return c.addNeeded(hostPath, f)
}

// addLibrary adds a library by soname, as if some executable needed it:
// for libraries that gpudra does not link but that what it dlopens does.
func (c *closure) addLibrary(soname string) error {
	if c.seen[soname] {
		return nil
	}
	imagePath, err := c.find(soname, nil)
	if err != nil {
		return err
	}
	return c.addResolved(soname, imagePath)
}

// addImageExecutable is [closure.addExecutable] for an executable of the
// root, named by its image path.
func (c *closure) addImageExecutable(imagePath string) error {
	hostPath, err := resolveInRoot(c.root, imagePath)
	if err != nil {
		return err
	}
	return c.addExecutable(hostPath)
}

func (c *closure) addNeeded(who string, f *elf.File) error {
	needed, err := f.DynString(elf.DT_NEEDED)
	if err != nil {
		return fmt.Errorf("%s: dynamic section: %w", who, err)
	}
	var runpath []string
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		values, err := f.DynString(tag)
		if err != nil {
			return fmt.Errorf("%s: dynamic section: %w", who, err)
		}
		for _, v := range values {
			for _, dir := range strings.Split(v, ":") {
				// $ORIGIN and friends would need the executable's path in
				// the image; nothing Debian ships for gpudra uses them.
				if dir != "" && !strings.Contains(dir, "$") {
					runpath = append(runpath, dir)
				}
			}
		}
	}
	for _, soname := range needed {
		if c.seen[soname] {
			continue
		}
		imagePath, err := c.find(soname, runpath)
		if err != nil {
			return fmt.Errorf("%s needs %s: %w", who, soname, err)
		}
		if err := c.addResolved(soname, imagePath); err != nil {
			return err
		}
	}
	return nil
}

func (c *closure) addResolved(soname, imagePath string) error {
	c.seen[soname] = true
	if !c.seen[imagePath] {
		c.seen[imagePath] = true
		c.paths = append(c.paths, imagePath)
	}
	hostPath, err := resolveInRoot(c.root, imagePath)
	if err != nil {
		return err
	}
	lib, err := elf.Open(hostPath)
	if err != nil {
		return fmt.Errorf("read ELF %s: %w", hostPath, err)
	}
	defer lib.Close()
	if err := c.checkMachine(hostPath, lib); err != nil {
		return err
	}
	return c.addNeeded(imagePath, lib)
}

func (c *closure) checkMachine(name string, f *elf.File) error {
	if c.machine == 0 {
		if _, ok := multiarch[f.Machine]; !ok {
			return fmt.Errorf("%s: machine %v is not supported (want x86-64 or aarch64)", name, f.Machine)
		}
		c.machine = f.Machine
	}
	if f.Machine != c.machine {
		return fmt.Errorf("%s: machine %v, want %v like the executable", name, f.Machine, c.machine)
	}
	return nil
}

// find looks a soname up where the loader would without an ld.so.cache
// (the image has none): DT_RUNPATH, then glibc's system search path as
// Debian builds it. The path returned is the image path under which the
// loader opens it.
func (c *closure) find(soname string, runpath []string) (string, error) {
	if strings.Contains(soname, "/") {
		return soname, nil
	}
	dirs := append([]string{}, runpath...)
	triplet := multiarch[c.machine]
	dirs = append(dirs, "/lib/"+triplet, "/usr/lib/"+triplet, "/lib", "/usr/lib")
	for _, dir := range dirs {
		p := path.Join(dir, soname)
		if _, err := resolveInRoot(c.root, p); err == nil {
			return p, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(dirs, ", "))
}

// resolveInRoot returns the path on this machine of image path p under
// root, following symlinks as the loader in a container of the image
// would: an absolute target is under root too (Debian's libc6 links
// /lib64/ld-linux-x86-64.so.2 to /lib/x86_64-linux-gnu/...), so a sysroot
// of another architecture never leads to this machine's own files. It
// fails with an error that matches [fs.ErrNotExist] when p does not exist.
func resolveInRoot(root, p string) (string, error) {
	cur := "/"
	parts := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
	for links := 0; len(parts) > 0; {
		part := parts[0]
		parts = parts[1:]
		if part == "" {
			continue
		}
		next := path.Join(cur, part)
		hostPath := filepath.Join(root, next)
		fi, err := os.Lstat(hostPath)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if len(parts) > 0 && !fi.IsDir() {
				return "", fmt.Errorf("%s under %s: %s is not a directory: %w", p, root, next, fs.ErrNotExist)
			}
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s under %s: too many levels of symbolic links", p, root)
		}
		target, err := os.Readlink(hostPath)
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		parts = append(strings.Split(strings.TrimPrefix(path.Clean(target), "/"), "/"), parts...)
		cur = "/"
	}
	return filepath.Join(root, cur), nil
}

func interpreter(f *elf.File) (string, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", fmt.Errorf("read PT_INTERP: %w", err)
		}
		return strings.TrimRight(string(b), "\x00"), nil
	}
	return "", nil
}
