package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is one file, directory or symlink of a layer.
type entry struct {
	typeflag byte
	mode     int64
	uid, gid int
	linkname string // symlinks
	hostPath string // regular files copied from the host
	content  []byte // regular files written by us (when hostPath is "")
}

// tree is a layer's files by absolute image path. It is written as a tar
// sorted by path, with every timestamp the same, so one input gives one
// digest.
type tree map[string]*entry

func (t tree) dir(p string, mode fs.FileMode, uid, gid int) error {
	if e, ok := t[p]; ok {
		if e.typeflag != tar.TypeDir {
			return fmt.Errorf("%s: both a directory and a file or link", p)
		}
		return nil
	}
	t.parents(p)
	m := int64(mode.Perm())
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	t[p] = &entry{typeflag: tar.TypeDir, mode: m, uid: uid, gid: gid}
	return nil
}

// parents adds p's parent directories (0755, root) that t lacks. A parent
// that the host path crossed as a symlink was added as that symlink before
// (copyHost walks from the root down), so it is kept.
func (t tree) parents(p string) {
	for dir := path.Dir(p); dir != "/" && dir != "."; dir = path.Dir(dir) {
		if _, ok := t[dir]; !ok {
			t[dir] = &entry{typeflag: tar.TypeDir, mode: 0o755}
		}
	}
}

func (t tree) file(p string, content []byte, mode fs.FileMode) {
	t.parents(p)
	t[p] = &entry{typeflag: tar.TypeReg, mode: int64(mode.Perm()), content: content}
}

func (t tree) hostFile(p, hostPath string, mode fs.FileMode) {
	t.parents(p)
	t[p] = &entry{typeflag: tar.TypeReg, mode: int64(mode.Perm()), hostPath: hostPath}
}

// copyHost adds the host file at image path p (under root), reproducing
// every symlink on the way as a symlink, so the loader finds
// /lib64/ld-linux-x86-64.so.2 in the image as it does on the host: through
// /lib64 -> usr/lib64 and a link to /lib/x86_64-linux-gnu/.
func (t tree) copyHost(root, p string) error {
	return t.copyHostDepth(root, p, 0)
}

func (t tree) copyHostDepth(root, p string, depth int) error {
	if depth > 40 {
		return fmt.Errorf("%s: too many levels of symbolic links", p)
	}
	parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := path.Join(cur, part)
		hostPath := filepath.Join(root, next)
		fi, err := os.Lstat(hostPath)
		if err != nil {
			return err
		}
		last := i == len(parts)-1
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(hostPath)
			if err != nil {
				return err
			}
			if e, ok := t[next]; ok && (e.typeflag != tar.TypeSymlink || e.linkname != target) {
				return fmt.Errorf("%s: a symlink on the host, something else in the image", next)
			}
			t.parents(next)
			t[next] = &entry{typeflag: tar.TypeSymlink, mode: 0o777, linkname: target}
			resolved := target
			if !path.IsAbs(target) {
				resolved = path.Join(cur, target)
			}
			rest := append([]string{resolved}, parts[i+1:]...)
			return t.copyHostDepth(root, path.Join(rest...), depth+1)
		case fi.IsDir():
			if err := t.dir(next, fi.Mode(), 0, 0); err != nil {
				return err
			}
			if last {
				return nil
			}
			cur = next
		case fi.Mode().IsRegular():
			if !last {
				return fmt.Errorf("%s: not a directory", next)
			}
			t.hostFile(next, hostPath, fi.Mode())
			return nil
		default:
			return fmt.Errorf("%s: %v is neither a file, a directory nor a symlink", next, fi.Mode().Type())
		}
	}
	return nil
}

// tar writes t as a tar archive; every entry has the time modTime.
func (t tree) tar(modTime time.Time) ([]byte, error) {
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range names {
		e := t[name]
		hdr := &tar.Header{
			Typeflag: e.typeflag,
			Name:     strings.TrimPrefix(name, "/"),
			Linkname: e.linkname,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			ModTime:  modTime,
		}
		if e.typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		var body io.Reader
		if e.typeflag == tar.TypeReg {
			content := e.content
			if e.hostPath != "" {
				var err error
				if content, err = os.ReadFile(e.hostPath); err != nil {
					return nil, err
				}
			}
			hdr.Size = int64(len(content))
			body = bytes.NewReader(content)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
