package mps

// SetAfterProcList makes m run f each time it has listed the process table
// to look for daemons, before it reads the processes listed.
func SetAfterProcList(m *Manager, f func()) { m.proc.afterList = f }
