package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

// printTable prints pod, phase, node, devices, and the CDI devices per
// container, one device per line; a pod that is not running gets its
// reason on a line of its own.
func printTable(w io.Writer, r *cluster.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tPHASE\tNODE\tDEVICES\tCONTAINER: CDI DEVICES")
	for _, p := range r.Pods {
		var devices []string
		for _, c := range p.Claims {
			for _, res := range c.Results {
				devices = append(devices, res.Device)
			}
		}
		var cdi []string
		for _, c := range p.Containers {
			for _, id := range c.CDIDevices {
				cdi = append(cdi, c.Name+": "+id)
			}
		}
		rows := max(1, len(devices), len(cdi))
		for i := range rows {
			cols := []string{"", "", "", at(devices, i), at(cdi, i)}
			if i == 0 {
				node := p.Node
				if node == "" {
					node = "-"
				}
				cols[0], cols[1], cols[2] = p.Namespace+"/"+p.Name, p.Phase, node
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cols[0], cols[1], cols[2], cols[3], cols[4])
		}
		if p.Reason != "" {
			fmt.Fprintf(tw, "\t\t\treason: %s\t\n", p.Reason)
		}
	}
	tw.Flush()
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	if i == 0 {
		return "-"
	}
	return ""
}
