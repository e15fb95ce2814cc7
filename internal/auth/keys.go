package auth

// codeKeys spells the Redis keys of one phone's login code. They share the
// hash tag {login:PHONE}, so each script's keys sit in one cluster slot. The
// phone is validated (E.164) before any key is built from it.
type codeKeys struct{ prefix string }

func (k codeKeys) tag(phone string) string { return k.prefix + ":{login:" + phone + "}" }

// Code is the current code of a phone: hash digest, tries, locked.
func (k codeKeys) Code(phone string) string { return k.tag(phone) + ":code" }

// Resend exists while a new code may not be sent to the phone yet.
func (k codeKeys) Resend(phone string) string { return k.tag(phone) + ":resend" }

// Sent counts the codes sent to the phone in the current window.
func (k codeKeys) Sent(phone string) string { return k.tag(phone) + ":sent" }
