package cluster

import (
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes a self-contained admin kubeconfig for server.
func writeKubeconfig(path, server string, p *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["onehop"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: p.adminCertPEM, ClientKeyData: p.adminKeyPEM}
	cfg.Contexts["onehop"] = &clientcmdapi.Context{Cluster: "onehop", AuthInfo: "admin"}
	cfg.CurrentContext = "onehop"
	return clientcmd.WriteToFile(*cfg, path)
}

// writeClientKubeconfig writes a kubeconfig for server with a client
// certificate.
func writeClientKubeconfig(path, server string, caPEM, certPEM, keyPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["onehop"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["client"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["onehop"] = &clientcmdapi.Context{Cluster: "onehop", AuthInfo: "client"}
	cfg.CurrentContext = "onehop"
	return clientcmd.WriteToFile(*cfg, path)
}
