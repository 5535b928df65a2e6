package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Deep copies of the ComputeDomain kinds, written by hand in deepcopy-gen's
// shape like those in deepcopy.go (TestComputeDomainDeepCopy fills every
// field and checks that nothing is shared).

// DeepCopyInto copies c into out, sharing nothing.
func (c *ComputeDomainChannelConfig) DeepCopyInto(out *ComputeDomainChannelConfig) { *out = *c }

// DeepCopy returns a copy of c.
func (c *ComputeDomainChannelConfig) DeepCopy() *ComputeDomainChannelConfig {
	if c == nil {
		return nil
	}
	out := new(ComputeDomainChannelConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *ComputeDomainChannelConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *ComputeDomainDaemonConfig) DeepCopyInto(out *ComputeDomainDaemonConfig) { *out = *c }

// DeepCopy returns a copy of c.
func (c *ComputeDomainDaemonConfig) DeepCopy() *ComputeDomainDaemonConfig {
	if c == nil {
		return nil
	}
	out := new(ComputeDomainDaemonConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *ComputeDomainDaemonConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *ComputeDomain) DeepCopyInto(out *ComputeDomain) {
	*out = *c
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	c.Spec.DeepCopyInto(&out.Spec)
	c.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *ComputeDomain) DeepCopy() *ComputeDomain {
	if c == nil {
		return nil
	}
	out := new(ComputeDomain)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *ComputeDomain) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies s into out, sharing nothing.
func (s *ComputeDomainSpec) DeepCopyInto(out *ComputeDomainSpec) {
	*out = *s
	if s.Channel != nil {
		ch := *s.Channel
		out.Channel = &ch
	}
}

// DeepCopyInto copies s into out, sharing nothing.
func (s *ComputeDomainStatus) DeepCopyInto(out *ComputeDomainStatus) {
	*out = *s
	if s.Nodes != nil {
		out.Nodes = make([]*ComputeDomainNode, len(s.Nodes))
		for i, n := range s.Nodes {
			if n != nil {
				copied := *n
				out.Nodes[i] = &copied
			}
		}
	}
	if s.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(s.Conditions))
		for i := range s.Conditions {
			s.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	if s.Channel != nil {
		ch := *s.Channel
		out.Channel = &ch
	}
}

// DeepCopyInto copies l into out, sharing nothing.
func (l *ComputeDomainList) DeepCopyInto(out *ComputeDomainList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]ComputeDomain, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l that shares nothing with it.
func (l *ComputeDomainList) DeepCopy() *ComputeDomainList {
	if l == nil {
		return nil
	}
	out := new(ComputeDomainList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (l *ComputeDomainList) DeepCopyObject() runtime.Object {
	if l := l.DeepCopy(); l != nil {
		return l
	}
	return nil
}

// DeepCopyInto copies c into out, sharing nothing.
func (c *ComputeDomainClique) DeepCopyInto(out *ComputeDomainClique) {
	*out = *c
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if c.Daemons != nil {
		out.Daemons = make([]*ComputeDomainDaemonInfo, len(c.Daemons))
		for i, d := range c.Daemons {
			if d != nil {
				copied := *d
				out.Daemons[i] = &copied
			}
		}
	}
}

// DeepCopy returns a copy of c that shares nothing with it.
func (c *ComputeDomainClique) DeepCopy() *ComputeDomainClique {
	if c == nil {
		return nil
	}
	out := new(ComputeDomainClique)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (c *ComputeDomainClique) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies l into out, sharing nothing.
func (l *ComputeDomainCliqueList) DeepCopyInto(out *ComputeDomainCliqueList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]ComputeDomainClique, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l that shares nothing with it.
func (l *ComputeDomainCliqueList) DeepCopy() *ComputeDomainCliqueList {
	if l == nil {
		return nil
	}
	out := new(ComputeDomainCliqueList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements [runtime.Object].
func (l *ComputeDomainCliqueList) DeepCopyObject() runtime.Object {
	if l := l.DeepCopy(); l != nil {
		return l
	}
	return nil
}
