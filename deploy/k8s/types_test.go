package k8s

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	policyv1 "k8s.io/api/policy/v1"
)

// cnpgCluster is the part of CloudNativePG's Cluster (postgresql.cnpg.io/v1)
// that the prod overlay uses. CloudNativePG's Go API module is not among
// the modules this build may fetch, so the test decodes strictly into this
// subset: a field the overlay sets that is not here fails the test, and must
// be checked against CloudNativePG's reference before it is added.
type cnpgCluster struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Instances             int    `json:"instances"`
		ImageName             string `json:"imageName"`
		PrimaryUpdateStrategy string `json:"primaryUpdateStrategy"`
		PostgreSQL            struct {
			Synchronous *struct {
				Method         string `json:"method"`
				Number         int    `json:"number"`
				DataDurability string `json:"dataDurability"`
			} `json:"synchronous"`
			Parameters map[string]string `json:"parameters"`
		} `json:"postgresql"`
		Bootstrap struct {
			InitDB struct {
				Database string `json:"database"`
				Owner    string `json:"owner"`
			} `json:"initdb"`
		} `json:"bootstrap"`
		Managed struct {
			Roles []struct {
				Name           string `json:"name"`
				Ensure         string `json:"ensure"`
				Login          bool   `json:"login"`
				PasswordSecret struct {
					Name string `json:"name"`
				} `json:"passwordSecret"`
			} `json:"roles"`
		} `json:"managed"`
		Storage struct {
			Size string `json:"size"`
		} `json:"storage"`
		WALStorage struct {
			Size string `json:"size"`
		} `json:"walStorage"`
		Resources struct {
			Requests map[string]string `json:"requests"`
			Limits   map[string]string `json:"limits"`
		} `json:"resources"`
	} `json:"spec"`
}

func metav1Selector(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

func metav1LabelSelector(p *policyv1.PodDisruptionBudget) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(p.Spec.Selector)
}

// certIssuer and certificate are the parts of cert-manager's Issuer and
// Certificate (cert-manager.io/v1) that the prod overlay uses, decoded
// strictly like cnpgCluster: cert-manager's Go API module is not among the
// modules this build may fetch.
type certIssuer struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		SelfSigned *struct{} `json:"selfSigned"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

type certificate struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		IsCA        bool     `json:"isCA"`
		CommonName  string   `json:"commonName"`
		SecretName  string   `json:"secretName"`
		DNSNames    []string `json:"dnsNames"`
		Usages      []string `json:"usages"`
		Duration    string   `json:"duration"`
		RenewBefore string   `json:"renewBefore"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name string `json:"name"`
			Kind string `json:"kind"`
		} `json:"issuerRef"`
	} `json:"spec"`
}
