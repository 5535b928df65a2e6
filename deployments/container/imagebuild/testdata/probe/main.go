// Command probe is a static program that prints "probe ok": the tests run
// it with runc in a rootfs of its own, to tell a runc that cannot run
// containers on this machine from an image that does not work.
package main

import "fmt"

func main() { fmt.Println("probe ok") }
