package main

import (
	"log/slog"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/order"
	"seckill/internal/voucher"
)

// deps is what run built and the routes use.
type deps struct {
	cfg      config
	log      *slog.Logger
	rdb      *redis.Client
	db       *gorm.DB
	signer   *auth.Signer
	keys     voucher.Keys
	vouchers *voucher.HTTP
	orders   *order.HTTP
	health   *health
}

// addRoutes lists the whole HTTP surface.
func addRoutes(r *gin.Engine, d deps) {
	r.GET("/healthz", d.health.live)
	r.GET("/readyz", d.health.ready)

	api := r.Group("/api/v1", d.signer.Middleware())
	api.GET("/vouchers", d.vouchers.List)
	api.GET("/vouchers/:id", d.vouchers.Show)
	api.POST("/vouchers", auth.RequireAdmin(), d.vouchers.Create)
	api.POST("/vouchers/:id/orders", d.vouchers.Purchase)
	api.GET("/orders/:id", d.orders.Show)
	api.GET("/users/me/orders", d.orders.Mine)
}
